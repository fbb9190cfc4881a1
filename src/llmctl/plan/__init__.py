"""`llmctl plan`: parameters, FLOPs, time, cost, memory, data and checkpoints of a run, before it
is launched (spec 001-compute-appendix §B-F, 001-arch-optim-scaling §A11, 001-systems-ops §A2, §A7)."""

from llmctl.torchrt.hardware import Hardware, load_table, lookup
from llmctl.plan.arch import Arch, arch_from_hf, from_model_config, load_hf_config, load_preset
from llmctl.plan.planner import plan

__all__ = ["Arch", "Hardware", "arch_from_hf", "from_model_config", "load_hf_config", "load_preset",
           "load_table", "lookup", "plan"]
