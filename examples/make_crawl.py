"""Generate the embedded example crawl: two small, Common-Crawl-shaped WARC files.

    python examples/make_crawl.py [--out examples/crawl] [--seed 1234]

The crawl is the input of llmctl's demos and of the end-to-end test of every stage, so all
that is in it is planted on purpose and written down in `planted.json` next to the WARCs:

* ~700 English articles on ten fake news / travel / nature sites, wrapped in real page chrome
  (cookie banner, header + nav, sidebar, footer). The text comes from a seeded world (towns on
  rivers in regions, people, crafts, animals, dishes, historical events) whose facts never
  change, rendered by a grammar with many sentence forms; several articles describe the same
  town in different words, so a small model trained on them can learn real structure.
* ~150 math practice pages of GSM8K-style word problems (solutions end in `#### <answer>`),
  prompts and ground truth for the eval and RL stages.
* exact duplicates (same HTML under another URL) and 60 near-duplicate pairs at planted word
  5-gram Jaccard levels 0.3 ... 0.95: the dedup stage's ground truth. Articles and language
  pages not planted as duplicates of each other stay below Jaccard 0.25.
* German, French, Spanish, Polish and Chinese pages for language ID.
* junk for the quality filters: link farms, keyword spam, repeated lines, lorem ipsum,
  boilerplate-only and empty pages.
* records the extractor must survive: PNG / PDF / JSON / CSS / robots.txt responses, 404s,
  redirects, a revisit, a truncated record, gzip Content-Encoding, chunked Transfer-Encoding,
  a page without Content-Type and a windows-1252 page that names its charset only in <meta>.

Each capture is a request, a response (or revisit) and a metadata record, as in Common Crawl.
The output is byte-for-byte reproducible: one seeded random.Random, fixed dates, uuid5 record
ids, gzip members written with mtime 0. Only the standard library and warcio are used.
"""
import argparse
import hashlib
import html
import io
import json
import random
import re
import struct
import unicodedata
import uuid
import zlib
from datetime import datetime, timedelta, timezone
from pathlib import Path

from warcio.warcwriter import WARCWriter

FILES = ("CC-EXAMPLE-00000.warc.gz", "CC-EXAMPLE-00001.warc.gz")
START = datetime(2024, 3, 1, 6, 0, 0, tzinfo=timezone.utc)  # crawl time; articles are dated before it
NEAR_DUP_TARGETS = (0.3, 0.5, 0.7, 0.8, 0.9, 0.95)
NEAR_DUP_TOL = 0.03
ARTICLE_KINDS = dict(town=205, person=150, animal=70, food=65, event=90, river=35, compare=55, craft=30)


# ----------------------------------------------------------------------------- helpers
ALT = re.compile(r"\[([^\[\]]*)\]")


def say(rng, template, ctx):
    """Expand [a|b|c] alternatives (innermost first), fill {slots} from ctx, capitalize."""
    while (expanded := ALT.sub(lambda m: rng.choice(m.group(1).split("|")), template)) != template:
        template = expanded
    s = template.format_map(ctx)
    return s[0].upper() + s[1:]


def an(word):
    return ("an " if word[0] in "aeiou" else "a ") + word


def fixed(key, lo, hi):
    """A stable number for a fact (how many otters live on a river): the same in every article."""
    return lo + zlib.crc32(key.encode()) % (hi - lo + 1)


def shingles(text, n=5):
    """Word 5-grams as planted.json defines them: lowercased, punctuation stripped, split on whitespace."""
    words = re.sub(r"[^\w\s]", "", text.lower()).split()
    return {tuple(words[i:i + n]) for i in range(max(len(words) - n + 1, 0))}


def jaccard(a, b):
    sa, sb = shingles(a), shingles(b)
    return len(sa & sb) / len(sa | sb) if sa | sb else 1.0


def titlecase(title):
    small = {"a", "an", "and", "at", "for", "from", "in", "of", "on", "or", "the", "to", "with"}
    words = title.split(" ")
    return " ".join(w if i and w in small and not words[i - 1].endswith(":") else w[:1].upper() + w[1:] for i, w in enumerate(words))


def slugify(text):
    text = unicodedata.normalize("NFKD", text.lower().replace("ł", "l").replace("ß", "ss"))
    return re.sub(r"[^a-z0-9]+", "-", text.encode("ascii", "ignore").decode()).strip("-")


def gzip_member(data):
    """One gzip member with a fixed header (mtime 0, OS unknown), so no time stamp sneaks in."""
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    body = c.compress(data) + c.flush()
    return b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff" + body + struct.pack("<II", zlib.crc32(data), len(data) & 0xFFFFFFFF)


# ----------------------------------------------------------------------------- the world
TOWN_A = "Ash Bram Cal Dun Elm Fen Gor Hal Kel Lin Mor Nor Oak Pen Ros Sel Thorn Wel Yar Brock Cran Har Lang Mill Stan Alder".split()
TOWN_B = "ford bury ton wick mere stead field haven moor bridge dale ham ley worth combe well".split()
RIVERS = "Tamsin Orrel Lune Wendle Carrow Isbourne Meldon Avonet Skerry Ferle".split()
REGIONS = "Northvale Eastmarch Brackenshire Westmoor Kellandshire Harrowdale".split()
FEMALE = "Mara Elena Ruth Agnes Clara Hannah Iris Jane Leah Nora Olive Rosa Sarah Tess Vera Alice Beth Dora Edith Freya Greta Hazel Ivy Lucy Maud Nell Pearl Sylvia".split()
MALE = "Tom Owen Hugh Silas Peter Arthur Ben Colin David Ewan Felix George Henry Isaac Jack Karl Leo Martin Neil Oscar Paul Ralph Simon Victor Walter Adam Edwin Frank".split()
SURNAMES = "Ashdown Barlow Carver Dunmore Ellery Fletcher Garland Hollis Ingram Jessop Kendrick Larkin Marsh Norwood Oakley Pritchard Quinlan Radley Sadler Thorne Underwood Vance Whitlock Yeoman Brennan Calloway Draper Fenwick Gilbert Harker".split()
MONTHS = "January February March April May June July August September October November December".split()
DAYS = "Monday Tuesday Wednesday Thursday Friday Saturday".split()
CRAFTS = [  # craft, worker, what the river gives it, products, the steps of the work
    ("weaving", "weaver", "soft water for washing wool", "blankets and woollen cloth",
     ["the wool is washed in the river", "it is spun into yarn", "the yarn is dyed with plants", "the cloth is woven on a wooden loom"]),
    ("pottery", "potter", "fine grey clay", "jugs, bowls and roof tiles",
     ["the clay is dug from the riverbank", "it is kneaded to push out the air", "each pot is shaped on the wheel", "the pots are fired in a kiln"]),
    ("boatbuilding", "boatbuilder", "oak from the forests upstream", "rowing boats and barges",
     ["the oak is cut and left to dry", "the keel is laid on the slipway", "the planks are steamed and bent", "the hull is sealed with tar"]),
    ("cheesemaking", "cheesemaker", "rich meadows for dairy cattle", "hard cheeses",
     ["the milk is warmed in copper pans", "rennet is added to make curds", "the curds are pressed into moulds", "the cheeses are stored in cool cellars"]),
    ("glassmaking", "glassblower", "clean white sand", "bottles and window glass",
     ["sand and ash are melted in a furnace", "the glass is gathered on a long pipe", "the glassblower shapes it with breath and tools", "the finished pieces cool slowly overnight"]),
    ("brewing", "brewer", "pure spring water", "dark ale and cider",
     ["barley is soaked until it sprouts", "the malt is dried in a kiln", "it is boiled with hops", "the ale rests in oak barrels"]),
    ("milling", "miller", "steady power for the mill wheels", "flour and oatmeal",
     ["the grain is cleaned and dried", "the river turns the great wheel", "the stones grind the grain", "the flour is sieved and packed in sacks"]),
    ("rope making", "rope maker", "hemp from the nearby fields", "ropes and fishing nets",
     ["the hemp is soaked and beaten", "the fibres are combed straight", "they are twisted into yarn", "three yarns are laid together into rope"]),
]
DISHES = [("pie", "mutton", "onions"), ("cake", "honey", "oats"), ("loaf", "rye flour", "caraway seeds"), ("stew", "eel", "leeks"),
          ("sausage", "pork", "sage"), ("tart", "plums", "cream"), ("buns", "currants", "nutmeg"), ("pudding", "apples", "brown sugar"),
          ("soup", "barley", "smoked fish"), ("pasty", "beef", "turnips")]
LANDMARKS = "stone bridge|market hall|water mill|clock tower|old abbey|town hall|grain store|iron footbridge|castle gate|chapel".split("|")
FESTIVALS = "Lantern Festival|River Day|Harvest Fair|Boat Race|Spring Market|Midsummer Fair|Apple Feast|Winter Fair".split("|")
FOUNDERS = ["a group of fishing families", "monks from a nearby abbey", "wool merchants", "farmers from the hills", "a band of boatmen", "settlers from the coast"]
RIVER_SHAPE = ["bends sharply to the south", "slows down and widens", "meets a smaller stream", "turns east towards the sea", "runs between two low hills"]
ANIMALS = [  # name, plural, habitat, diet, weight, lifespan in years, when active, young
    ("otter", "otters", "rivers and quiet streams", "fish, frogs and crayfish", "seven to nine kilograms", 10, "at dusk", "two or three cubs"),
    ("grey heron", "grey herons", "shallow water and marshes", "fish, frogs and small mammals", "about one and a half kilograms", 15, "early in the morning", "three to five chicks"),
    ("kingfisher", "kingfishers", "slow rivers and canals", "small fish and water insects", "about forty grams", 7, "during the day", "six or seven chicks"),
    ("badger", "badgers", "woodland edges and hedges", "earthworms, roots and fruit", "ten to twelve kilograms", 14, "at night", "two or three cubs"),
    ("red fox", "red foxes", "fields, woods and gardens", "mice, rabbits and berries", "five to seven kilograms", 9, "at dusk", "four or five cubs"),
    ("barn owl", "barn owls", "open meadows and old barns", "voles and mice", "about three hundred grams", 8, "at night", "four to six owlets"),
    ("brown trout", "brown trout", "cold, clear streams", "insects and small fish", "one to two kilograms", 12, "at dawn", "thousands of eggs"),
    ("water vole", "water voles", "grassy riverbanks", "grasses and reeds", "about three hundred grams", 2, "during the day", "five or six young"),
    ("mute swan", "mute swans", "lakes and wide rivers", "water plants", "ten to twelve kilograms", 20, "during the day", "five to seven cygnets"),
    ("red kite", "red kites", "open hills and farmland", "carrion and small animals", "about one kilogram", 25, "during the day", "one to three chicks"),
    ("hedgehog", "hedgehogs", "gardens and hedgerows", "beetles, worms and slugs", "about one kilogram", 5, "at night", "four or five hoglets"),
    ("roe deer", "roe deer", "woods and the edges of fields", "leaves, buds and brambles", "twenty to thirty kilograms", 12, "at dawn and dusk", "one or two fawns"),
]
EVENTS = [  # kind, what people call it, what happened, what came after, the years it can happen in
    ("flood", "the great flood", "the {R} burst its banks and water filled the lower streets of {T}", "the town built a stone wall along the river", (1300, 2010)),
    ("fire", "the great fire", "a fire that began in a bakery destroyed {evn} houses in {T}", "new houses in {T} were built of brick instead of wood", (1300, 1950)),
    ("bridge", "the opening of the new bridge", "a new bridge across the {R} was opened at {T}", "trade between {T} and {nb} grew quickly", (1400, 1990)),
    ("railway", "the arrival of the railway", "the first train reached {T} from {nb}", "visitors began to arrive from the cities", (1840, 1925)),
    ("charter", "the market charter", "{T} was given the right to hold a weekly market", "merchants from all over {G} came to trade in {T}", (1200, 1750)),
    ("school", "the opening of the grammar school", "the first school in {T} opened its doors to {evn} pupils", "{T} became known across {G} for its teachers", (1500, 1950)),
]


def build_world(rng):
    """Rivers through regions, towns on the rivers with fixed facts, people living in the towns."""
    rivers = [dict(R=r, regions=rng.sample(REGIONS, rng.choice([1, 2])), length=rng.randrange(40, 260), hills=rng.choice(REGIONS), towns=[])
              for r in RIVERS]
    towns = []
    for name in rng.sample(sorted({a + b for a in TOWN_A for b in TOWN_B if a.lower()[-1] != b[0]}), 36):
        river, craft, dish, y = rng.choice(rivers), rng.choice(CRAFTS), rng.choice(DISHES), rng.randrange(1080, 1780)
        t = dict(T=name, R=river["R"], G=rng.choice(river["regions"]), Y=y, pop=rng.randrange(800, 42000), craft=craft[0],
                 worker=craft[1], resource=craft[2], products=craft[3], food=f"{name} {dish[0]}", ing1=dish[1], ing2=dish[2],
                 lm=rng.choice(LANDMARKS), lmy=rng.randrange(y + 20, 1900), fest=rng.choice(FESTIVALS), month=rng.choice(MONTHS),
                 mday=rng.choice(DAYS), elev=rng.randrange(5, 420), founders=rng.choice(FOUNDERS), shape=rng.choice(RIVER_SHAPE),
                 km=rng.randrange(3, river["length"]), animal=rng.choice(ANIMALS))
        t["events"] = [dict(kind=e, year=rng.randrange(max(e[4][0], y + 30), max(e[4][1], y + 60)), n=rng.randrange(20, 240)) for e in rng.sample(EVENTS, 2)]
        river["towns"].append(t)
        towns.append(t)
    for river in rivers:
        river["towns"].sort(key=lambda t: t["km"])
    for t in towns:  # a neighbour: a town on the same river or in the same region
        t["nb"] = rng.choice([u for u in towns if u is not t and (u["R"] == t["R"] or u["G"] == t["G"])] or [u for u in towns if u is not t])
    people = []
    for _ in range(90):
        female, town = rng.random() < 0.5, rng.choice(towns)
        craft = town if rng.random() < 0.6 else dict(zip(("craft", "worker"), rng.choice(CRAFTS)))
        people.append(dict(first=rng.choice(FEMALE if female else MALE), last=rng.choice(SURNAMES), female=female, town=town,
                           craft=craft["craft"], prof=craft["worker"], born=rng.randrange(1940, 1996),
                           teacher=rng.choice(["{pos} mother", "{pos} father", "{pos} grandfather", "an old {prof} in {nb}", "{pos} aunt"]),
                           workshop=rng.choice(["a small workshop near the {lm}", "an old shed by the {R}", "a stone barn outside {T}", "a yard behind the market square"]),
                           prize=rng.randrange(2, 9), start=rng.randrange(4, 8)))
    return dict(towns=towns, rivers=[r for r in rivers if r["towns"]], people=people)


# ----------------------------------------------------------------------------- English grammar
# Every fact has several surface forms; [a|b] picks one alternative, {slot} is a fact of the
# world. "fill" sentences are generic colour, built from many independent choices so that two
# articles rarely share a 5-gram by accident.
EN = {
    "loc": ["{T} lies on the {R} in {G}.", "The town of {T} sits on the [banks|east bank|west bank] of the {R}, [in the heart of|in the south of|in the quiet north of] {G}.",
            "{T} is [a small|a quiet|a busy|an old] [town|market town] in {G}, built where the {R} {shape}.",
            "[Anyone who travels|Sooner or later, anyone driving|Every walker who heads] through {G} will [come to|pass through|stop in] {T} and [cross|see] the {R}.",
            "Built on the {R}, {T} has long been one of the [best-known|most visited|most loved] towns in {G}.",
            "On a map of {G}, {T} is easy to find: it is the town where the {R} {shape}.",
            "The {R} runs right through {T}, [dividing the old town from the newer streets|past the gardens of the old houses|under three low bridges]."],
    "founded": ["{T} was founded in {Y}[.|, a date still carved above the door of the {lm}.]", "The first houses in {T} were built in {Y}, when {founders} settled by the [river|{R}].",
                "[Records show|The town archive shows|Old maps show] that {T} dates back to {Y}.", "{T} has stood for {age} years, since [its founding|it was founded] in {Y}.",
                "According to [the town archive|local historians|an old chronicle], {T} was founded in the year {Y} by {founders}.",
                "It was in {Y} that {founders} [built the first houses|cleared the land|put up the first mill] at {T}."],
    "pop": ["Today [about|around|nearly] {P} people live in {T}.", "{T} has a population of {P}[.|, a number that has barely changed in [twenty|thirty] years.]",
            "The town is home to [around|about|roughly] {P} people.", "With {P} residents, {T} is {cmp} than {nb}, which has {nbP}.", "At the last count, {P} people called {T} home.",
            "Although only {P} people live there, {T} [is busy on market days|feels larger than it is|has [two|three] schools and a hospital]."],
    "craft": ["For [centuries|generations|hundreds of years] the people of {T} have earned their living from {craft}.",
              "{Craft} is still the main trade in {T}[.|, although fewer young people take it up than before.]", "Because the {R} provided {resource}, {T} became a centre of {craft}.",
              "[Most|Many] families in {T} have at least one member who works in {craft}.", "The workshops of {T} are known across {G} for their {products}.",
              "{T} grew rich on {craft}, and the old workshops can still be seen [near the river|behind the market square|on the road to {nb}]."],
    "food": ["{T} is famous for its {food}, made from {ing1} and {ing2}.", "No visit to {T} is complete without [a plate|a slice|a helping] of {food}.",
             "The local speciality is {food}, a dish of {ing1} and {ing2}.", "If you ask anyone in {T} what to eat, the answer will be {food}.",
             "[Bakers|Cooks|Families] in {T} still make {food} the way their grandparents did, with {ing1} and {ing2}."],
    "landmark": ["The {lm} of {T}, built in {lmy}, is [the oldest building|one of the oldest buildings] in the town.", "The most famous sight in {T} is the {lm}, which dates from {lmy}.",
                 "Visitors often begin at the {lm}, completed in {lmy}.", "In {lmy} the townspeople built the {lm}, and it still stands today.",
                 "The {lm} has [watched over|stood at the centre of] {T} since {lmy}."],
    "festival": ["Every {month}, {T} holds the {fest}.", "The {fest} takes place each {month} and draws visitors from all over {G}.",
                 "In {month} the streets fill with [music|bands and dancers] for the {fest}.", "The highlight of the year in {T} is the {fest}, held in {month}.",
                 "During the {fest} in {month}, the [town square|riverbank] is full of stalls selling {food}."],
    "market": ["The weekly market is held every {mday} in the town square.", "Every {mday}, the square in front of the {lm} becomes a busy market.",
               "On {mday}s, farmers from the hills bring [their goods|cheese, eggs and vegetables|lambs and wool] to the market in {T}."],
    "elev": ["The town lies {elev} metres above sea level.", "At {elev} metres above the sea, {T} {elevnote}."],
    "neighbour": ["The nearest town is {nb}, about {nbkm} kilometres away.", "{T} and {nb} have been [friendly rivals|close partners] for as long as anyone can remember.",
                  "[A footpath|An old road|A bus route] links {T} with {nb}, {nbkm} kilometres [to the north|away|along the valley]."],
    "event": ["In {evy}, {evd}.", "The year {evy} is remembered in {T} for {ev}.", "{Ev} in {evy} changed the town for ever.",
              "[Older residents|Many families] still [talk about|tell stories of] {ev} of {evy}.", "After {ev} in {evy}, {evafter}."],
    "animal": ["{Ans} can often be seen along the {R} near {T}.", "The meadows and water around {T} are home to {ans}, which feed on {diet}.",
               "[Early in the morning|On quiet evenings], you may spot {a_an} [on the riverbank below the {lm}|near the old mill race]."],
    "fill": ["[Visitors|Walkers|Families|Photographers|Anglers] who come [in spring|in late summer|on a wet autumn day|early in the year] [will find|often find|are surprised to find] [the {R} running high|the meadows full of flowers|the lanes quiet|the market stalls busy].",
             "[From|Seen from] [the top of the hill|the old towpath|the far bank of the {R}], {T} [looks smaller than it is|looks almost like a village|seems hardly changed since {lmy}].",
             "[Local|Older] [residents|shopkeepers|farmers] [like to say|often say|will tell you] that [the {R} decides everything here|the best days are in {month}|nothing in {T} happens quickly|{nb} is a nice place to visit but not to live].",
             "A [narrow|cobbled|steep] [lane|street|path] [leads|runs|climbs] from the {lm} [down to the water|up to the church|towards the road to {nb}].",
             "[On market days|During the {fest}|On long summer evenings], [the cafés|the inns|the benches by the river] [fill up quickly|are rarely empty|stay busy until late].",
             "[There is|You will also find] [a small museum|a lending library|a rowing club|a choir of forty voices] in {T}, [run by volunteers|open at weekends|founded the same year as the {lm}].",
             "[Buses|Trains|Narrow roads] [link|connect] {T} with {nb} and the rest of {G}[.|, although the service is slow in winter.]",
             "[Like many towns in {G}|As in much of {G}], {T} [has changed slowly|has kept its old character|has grown in recent years].",
             "The weather in {G} is [mild|wet|windy] [for most of the year|in autumn and winter], [so the {R} is often high in spring|and the fields around {T} stay green]."],
    "p_intro": ["{per} has been {a_prof} in {T} for {pyears} years.", "One of the best-known people in {T} is {per}, {a_prof}.",
                "[For {pyears} years|Since {pstart}], {per} has worked as {a_prof} in {T}."],
    "p_born": ["[Born in {born}, {first}|{per}, born in {born},] grew up [in {T}|by the {R}|on a farm outside {T}].",
               "{first} was born in {born} [in a house near the {lm}|in {nb}, but moved to {T} as a child]."],
    "p_teacher": ["{Pro} learned the trade from {teacher} when {pro} was {startage}.", "At the age of {startage}, {first} began to learn {pcraft} from {teacher}.",
                  "It was {teacher} who taught {first} the craft, starting when {pro} was only {startage}."],
    "p_work": ["Today {first} works in {workshop}, where {pro} makes {pproducts}.", "{Pos} workshop is {workshop}, and [most of|nearly all of] {pos} {pproducts} are sold in {G}."],
    "p_day": ["[Most days|Each morning|Six days a week], {first} [starts work|opens the workshop] at {hour} o'clock and [works until dark|stays until the late afternoon].",
              "[A normal day|The working day] begins at {hour} o'clock, [when the {R} is still covered in mist|long before the shops open]."],
    "p_prize": ["{first} has won the craft prize at the {fest} in {T} {prize} times.", "{Pos} work has won the prize at the {fest} {prize} times[.|, more than anyone else in {T}.]"],
    "p_view": ["Ask {per}, the {prof}, and you will hear that {opinion}.", "{first} [believes|is sure] that {opinion}."],
    "quote": ["\"{quote},\" says {first}.", "\"{quote},\" {first} [explains|says with a smile|tells visitors].", "\"{quote},\" says {per}, who works as {a_prof} in {T}.",
              "When asked about {pos} work, {first} [says|answers]: \"{quote}.\""],
    "future": ["{first} [hopes|plans] to [take on an apprentice|open a second workshop|write a book about {pcraft}|teach {pcraft} at the school in {T}] [next year|in the coming years|one day]."],
}
QUOTES = ["The {R} gives us everything we have", "I have never wanted to live anywhere but {T}", "You cannot hurry good {pcraft}",
          "The {fest} is the best week of the whole year", "People come for the {lm}, but they stay for the {food}", "Every season on the river is different",
          "The young people are coming back to {T}, and that gives me hope", "A good {prof} needs patience more than strength",
          "When the {R} is high, the whole town holds its breath", "My hands know the work better than my head does", "I still make mistakes, and I still learn from them"]
OPINIONS = ["the town has changed more in the last ten years than in the fifty before", "the best {food} is sold at the {mday} market",
            "the {R} is cleaner now than it was in {pos} childhood", "nobody in {G} makes {pproducts} like the people of {T}"]
EN_ANIMAL = {
    "intro": ["{Ans} are [among the most familiar|among the shyest|among the most loved] animals of {G}.", "Along the {R}, {ans} [are|have become] a [common|rare|welcome] sight.",
              "[Few|Not many] [visitors|people] [realise|know] how many {ans} live along the {R}.", "[For a long time|For years], {ans} were [hard to find|rarely seen] near {T}, but that is changing."],
    "habitat": ["{Ans} [live in|prefer|are found in] {hab}.", "[Look for|You can find] {ans} in {hab}, [especially near {T}|from {T} down to {T2}|all along the {R}]."],
    "diet": ["{Ans} [feed|live] mainly on {diet}.", "The diet of {a_an} is made up of {diet}.", "In the wild, {a_an} eats {diet}[.|, depending on the season.]"],
    "body": ["An adult {an} weighs {weight}.", "{Ans} can live for up to {life} years [in the wild|if they survive their first winter].",
             "A fully grown {an} weighs {weight}, [less than most people expect|which surprises many visitors]."],
    "habits": ["{Ans} are most active {active}, [which is why few people see them|so the best time to watch them is {active}].", "Each year {a_an} raises {young}.",
               "[In spring|Every year], {a_an} raises {young} [close to the water|in a hidden place]."],
    "count": ["Last year volunteers counted {count} {ans} along the {R}.", "The number of {ans} has {trend} since {since}, according to [local naturalists|the {G} wildlife trust].",
              "[Between {T} and {T2}|On the stretch near {T}], {count} {ans} were [counted|recorded] [last spring|in the latest survey]."],
    "advice": ["[If you want to see|To see] {ans}, [go out {active}|walk quietly along the bank|bring binoculars], [and keep your distance|and never disturb their young].",
               "[Keep dogs on a lead|Stay on the path] near {T}, [because|since] {ans} [are easily disturbed|raise their young there]."],
    "fill": ["[On a still morning|After heavy rain|In the last light of the day], the [reeds|water meadows|willows] [below|around] {T} [are full of birdsong|are perfectly quiet|hide more life than you would think].",
             "[A local teacher|A retired ferryman|One of the wardens] [keeps a diary of|has photographed] every {an} seen near the {lm} since {since}.",
             "[Cold winters|Dry summers|Floods on the {R}] [are hard on|can be hard on|make life difficult for] {ans}[.|, but they usually recover.]",
             "[Children from the school in {T}|Volunteers from {nb}] [help with the count|clean the riverbank] every {month}."],
}
EN_FOOD = {
    "intro": ["{food} is [the best-known dish of {T}|a speciality of {T}|what {T} is famous for].", "At its heart, {food} is a [simple|hearty|filling] {dish} made from {ing1} and {ing2}.",
              "[Ask|Talk to] anyone in {T} about food and [sooner or later|before long] {food} [will come up|is mentioned]."],
    "history": ["The first recipe for {food} [dates from|was written down in] {fyear}.", "Cooks in {T} [say|claim] that {food} was first made for the {fest}.",
                "{food} was [once|long] [a dish for the poor|eaten by the {worker}s of {T} at midday].",
                "[Nobody knows exactly|Nobody is quite sure] who first made {food}, but the recipe [appears in|is found in] [a cookery book|a letter|the town archive] from {fyear}."],
    "season": ["{food} is eaten all year, but [most of all|especially] in {month}, during the {fest}.", "[Every|Each] {mday}, the market in {T} sells {food} [by the dozen|fresh from the oven].",
               "[In winter|On cold days], [most kitchens in {T} smell of|half the town seems to be making] {food}."],
    "tip": ["The secret, according to {per}, is to [use fresh {ing1}|take your time|let it rest overnight].", "[Serve it|It is best eaten] [warm|cold] with [bread|a glass of ale|fresh cream].",
            "[Do not|Never] [rush|skip] the [last step|resting time], [warns|says] {per}[.|, who has made {food} for years.]"],
    "fill": ["Some families add [a little honey|dried fruit|a spoon of mustard|a handful of herbs], [but|although] [purists|older cooks] [frown on it|say that is cheating].",
             "The best {food} in {T} is said to be served at [the inn by the {lm}|a small bakery on the market square|the stall of {per}].",
             "[Visitors|Many people] [are surprised|find it strange] that {food} [contains|is made with] {ing2}[.|, but one taste is usually enough to convince them.]",
             "[In the old days|A hundred years ago], {food} was [cooked|baked] [in the bread oven after the loaves|over an open fire] [on {mday}s|once a week].",
             "A good {food} [should be|is] [golden on top|rich but not heavy|full of {ing1}], [according to|say] [the judges at the {fest}|the older cooks of {T}].",
             "[Recipes for|Versions of] {food} [differ from house to house|are handed down in families|are closely guarded] in {T}."],
}
EN_EVENT = {
    "intro": ["In {evy}, {evd}.", "The year {evy} is remembered in {T} for {ev}.", "[Older residents|Many families] still [talk about|remember stories of] {ev} of {evy}."],
    "detail": ["[For {evdays} days|For almost a week], [life in {T} stood still|the town talked of nothing else].",
               "[The town council|The people of {T}] [met in the {lm}|gathered by the {R}] to decide what to do.",
               "[Letters|Diaries] from {evy} describe [crowds in the square|the fear and the hope of those days]."],
    "after": ["After {ev} in {evy}, {evafter}.", "[In the years that followed|Within a decade], {evafter}."],
    "memory": ["Today a [small plaque|stone] [near the {lm}|by the {R}] [marks|remembers] {ev}.", "Each {month}, the town remembers {ev} during the {fest}."],
    "quote": ["\"{equote},\" says {per}, [a local historian|who has studied the town archive for years]."],
}
EQUOTES = ["Without {ev}, {T} would be a very different place", "The records from {evy} are short, but they tell us a lot",
           "People forget how hard life was in {evy}", "You can still see the marks of {evy} if you know where to look"]
EN_CMP = ["[{T} is {older} than {T2}: it was founded in {Y}, {ydiff} years {befaft} its neighbour.|{T} was founded in {Y} and {T2} in {Y2}, so {T} is the {older} of the two by {ydiff} years.]",
          "[With {P} people, {T} is {cmp2} than {T2}, which has {P2}.|{T2} has {P2} residents, while {T} has {P}.]",
          "[Each town has its own festival|The two towns celebrate at different times of the year]: {T} has the {fest} in {month} and {T2} the {fest2} in {month2}.",
          "[When it comes to food|For food], {T} is known for its {food}, [while|whereas] {T2} is famous for {food2}.",
          "[{T} [lives from|depends on] {craft}, [while|but] {T2} [is known for|grew rich on] {craft2}.|The workshops of {T} are busy with {craft}; in {T2} it is {craft2} that matters most.]"]
EN_RIVER = {
    "intro": ["The {R} [rises|begins] in the hills of {hills} and [flows|runs] for {length} kilometres [through|across] {Gs}.",
              "At {length} kilometres, the {R} is [one of the longest|not the longest, but one of the busiest] rivers of {Gs}."],
    "town": ["[Further downstream|Next|After another few kilometres|Below the next bend], [the river reaches|the {R} flows past|walkers come to] {T}, [founded in {Y}|a town of {P} people|known for its {craft}|where the {lm} stands].",
             "{T} lies {km} kilometres from the source of the {R} [and is known for its {craft}|and has {P} residents|and holds the {fest} every {month}]."],
    "walk": ["[A footpath|The {R} Way] [follows|runs beside] the river [for most of its length|from {T} to {T2}].", "[Boats|Small ferries] still carry [walkers|goods|visitors] between {T} and {T2} in summer."],
}
EN_CRAFT = {
    "intro": ["{Craft} has been practised in {G} for [centuries|hundreds of years].", "Across {G}, {craft} is still [an important|a proud|a living] trade.",
              "[Few|Not many] trades in {G} are as old as {craft}[.|, and few have changed so little.]"],
    "resource": ["{Craft} needs {resource}, and [the {R} provides it|towns like {T} have plenty of it].", "It was {resource} that brought {craft} to {T} [in the first place|long ago]."],
    "products": ["The {worker}s of {T} [make|are known for] {products}.", "[Most|Many] of the {products} sold in {G} come from [{T}|workshops along the {R}]."],
    "steps": ["First, {s0}. Then {s1}.", "After that, {s2}. Finally, {s3}.", "The work has four stages: {s0}, {s1}, {s2}, and {s3}.",
              "[To begin with|At the start], {s0}; [next|after a while], {s1}.", "[Once|When] that is done, {s2}, and [at the end|last of all] {s3}."],
    "fill": ["[An apprentice|A beginner] needs [three|four|five] years [to learn the basics|before the work is good enough to sell].",
             "[The tools|Many of the tools] in the workshops of {T} are [older than the people using them|made by hand|handed down from parent to child].",
             "[In winter|When the {R} is high], [the work slows down|the workshops close early|the {worker}s repair their tools].",
             "[Buyers|Traders] come from [as far as the coast|all over {G}|{nb} and beyond] [for the {fest}|every {mday}] to buy {products}."],
}
TITLES = {
    "town": "[A Short History of {T}|{T}: Life on the {R}|Why {T} Is Worth a Visit|A Guide to {T}|{T}, the Old Town on the {R}|Discovering {T} in {G}|What Makes {T} Special]",
    "person": "[Meet {per}, the {Prof} of {T}|{per}: A Life in {Pcraft}|The {Prof} Who Keeps {T} Going|Portrait: {per} of {T}]",
    "animal": "[The {Ans} of the {R}|Watching {Ans} in {G}|A Year with the {Ans}|Where to See {Ans} Along the {R}]",
    "food": "[How to Make {Food}|{Food}: A Taste of {T}|The Story of {Food}|In Praise of {Food}]",
    "event": "[{Ev} of {evy} in {T}|When {T} Remembered {Ev}|{T} in {evy}: {Ev}|Looking Back at {Ev} of {evy}]",
    "river": "[Along the {R}: A Traveller's Guide|The {R} from Source to Sea|Towns of the {R}|Following the {R}]",
    "compare": "[{T} and {T2} Compared|{T} or {T2}?|Two Towns of {G}: {T} and {T2}|{T} Versus {T2}]",
    "craft": "[The {Craft} of {G}|{Craft}: An Old Trade in {G}|Keeping {Craft} Alive|Inside the {Craft} Workshops of {G}]",
}
HEADINGS = {"history": "[History|A Long History|Early Days|The Story of {T}|From {Y} to Today]", "work": "[Work and Trade|The Local Economy|Making a Living]",
            "life": "[Life in {T}|Festivals and Food|Town Life|What to Do]", "nature": "[Nature|The River|Around {T}|Wildlife]",
            "person": "[Early Years|Learning the Trade|How It Began]", "work2": "[A Day at Work|The Workshop|At Work]", "future": "[Looking Ahead|What Comes Next|The Future]"}
TOWN_LIST = ["The {lm}, built in {lmy}", "The [weekly|{mday}] market", "The {fest} [every|each] {month}", "[A plate|A slice] of {food}",
             "[The walk|The path] along the {R}", "[A day trip|The old road] to {nb}", "[The workshops|The old {craft} workshops] [by the river|near the square]"]
ANIMAL_LIST = ["[Habitat|Where it lives]: {hab}", "[Food|Diet]: {diet}", "[Weight|Adult weight]: {weight}", "Lifespan: up to {life} years",
               "[Young|Family]: {young}", "[Best seen|When to look]: {active}", "[Counted on the {R}|Latest count]: {count}"]


def town_ctx(t):
    """The facts of a town (and of its animal, dish and first event) as template slots."""
    a, nb, e = t["animal"], t["nb"], t["events"][0]
    return dict(T=t["T"], R=t["R"], G=t["G"], Y=t["Y"], age=2024 - t["Y"], P=f"{t['pop']:,}", craft=t["craft"], Craft=t["craft"].capitalize(),
                worker=t["worker"], resource=t["resource"], products=t["products"], food=t["food"], Food=t["food"].title(), ing1=t["ing1"],
                ing2=t["ing2"], lm=t["lm"], lmy=t["lmy"], fest=t["fest"], month=t["month"], mday=t["mday"], elev=t["elev"],
                founders=t["founders"], shape=t["shape"], km=t["km"], nb=nb["T"], nbP=f"{nb['pop']:,}", cmp="larger" if t["pop"] > nb["pop"] else "smaller",
                nbkm=fixed(min(t["T"], nb["T"]) + max(t["T"], nb["T"]), 4, 38),
                elevnote="is often wrapped in fog from the river" if t["elev"] < 150 else "has cold, clear winters",
                an=a[0], ans=a[1], Ans=a[1].capitalize(), a_an=an(a[0]), hab=a[2], diet=a[3], weight=a[4], life=a[5], active=a[6], young=a[7],
                dish=t["food"].split()[-1], fyear=fixed(t["food"], max(t["Y"], 1600), 1900)) | event_ctx(t, e)


def event_ctx(t, e):
    kind, ev, what, after, _ = e["kind"]
    base = dict(T=t["T"], R=t["R"], G=t["G"], nb=t["nb"]["T"], evn=e["n"])
    return dict(ev=ev, Ev=ev[0].upper() + ev[1:], evy=e["year"], evd=what.format_map(base), evafter=after.format_map(base),
                evn=e["n"], evdays=fixed(t["T"] + kind, 2, 9))


def person_ctx(p):
    she, pyears = p["female"], 2024 - p["born"] - 10 - p["start"] * 2
    c = town_ctx(p["town"]) | dict(per=f"{p['first']} {p['last']}", first=p["first"], prof=p["prof"], Prof=p["prof"].title(), a_prof=an(p["prof"]),
                                   pcraft=p["craft"], Pcraft=p["craft"].title(), pproducts=next(c[3] for c in CRAFTS if c[0] == p["craft"]),
                                   born=p["born"], pyears=pyears, pstart=2024 - pyears, startage=10 + p["start"], prize=p["prize"],
                                   hour=p["start"] + 1, pro="she" if she else "he", Pro="She" if she else "He", pos="her" if she else "his",
                                   Pos="Her" if she else "His")
    return c | dict(teacher=p["teacher"].format_map(c), workshop=p["workshop"].format_map(c))


def realize(rng, table, key, ctx, used):
    """One sentence for a fact, preferring a sentence form the article has not used yet."""
    forms = [f for f in table[key] if f not in used] or table[key]
    for _ in range(6):
        form = rng.choice(forms)
        if "{quote}" in form or "{opinion}" in form:  # a fresh quote each time someone speaks
            ctx = dict(ctx, quote=say(rng, rng.choice(QUOTES), ctx), opinion=rng.choice(OPINIONS).format_map(ctx))
        s = say(rng, form, ctx)
        if s not in used:
            break
    used.update((s, form))
    return s


def realizer(rng, table, ctx, used):
    """keys -> sentences; a key ending in '?' is used 60% of the time, so articles differ."""
    return lambda *keys: [realize(rng, table, k.rstrip("?"), ctx, used) for k in keys if not k.endswith("?") or rng.random() < 0.6]


def paragraphs(rng, sents):
    """Split a run of sentences into paragraphs of 3-7 sentences."""
    out, i = [], 0
    while i < len(sents):
        n = rng.randint(3, 7)
        n = len(sents) - i if len(sents) - i - n < 3 else n
        out.append(("p", sents[i:i + n]))
        i += n
    return out


TOPUP = {  # what tops up a short section: mostly generic colour (it keeps articles apart), some facts on topic
    "town": [(EN, "fill")] * 3 + [(EN, "landmark"), (EN, "market"), (EN, "neighbour"), (EN, "festival"), (EN, "pop")],
    "person": [(EN, "fill")] * 3 + [(EN, "quote"), (EN, "p_view"), (EN, "craft"), (EN, "market"), (EN, "landmark")],
    "animal": [(EN_ANIMAL, "fill")] * 2 + [(EN, "fill")] * 2 + [(EN_ANIMAL, "advice"), (EN_ANIMAL, "habits"), (EN, "animal")],
    "food": [(EN_FOOD, "fill")] * 2 + [(EN, "fill")] * 3 + [(EN_FOOD, "tip"), (EN, "market"), (EN, "food")],
    "event": [(EN, "fill")] * 3 + [(EN_EVENT, "detail"), (EN_EVENT, "memory"), (EN, "landmark"), (EN, "pop")],
    "river": [(EN, "fill")] * 3 + [(EN_RIVER, "walk"), (EN, "landmark"), (EN, "festival")],
    "compare": [(EN, "fill")] * 4 + [(EN, "market"), (EN, "neighbour")],
    "craft": [(EN_CRAFT, "fill")] * 2 + [(EN, "fill")] * 3 + [(EN_CRAFT, "products"), (EN, "market")]}


def build_article(rng, w, kind, subj):
    """Title + blocks (h2 / p / ul / table) + spare sentences (material to edit near-duplicates)."""
    used, extra = set(), []
    H = lambda key: HEADINGS[key] if rng.random() < 0.8 else None
    pick = lambda items, c: ("ul", [say(rng, s, c) for s in rng.sample(items, rng.randint(3, 5))])
    if kind == "town":
        t = subj
        c = town_ctx(t)
        r = realizer(rng, EN, c, used)
        people = [p for p in w["people"] if p["town"] is t]
        pers = realizer(rng, EN, person_ctx(rng.choice(people)), used)("p_intro", "quote?", "p_view?") if people else []
        evs = [realize(rng, EN, "event", c | event_ctx(t, e), used) for e in t["events"] if rng.random() < 0.8]
        mid = [(H("history"), r("founded", "landmark", "fill?") + evs), (H("work"), r("craft", "craft?", "market", "neighbour?", "fill?") + pers),
               (H("life"), r("festival", "food", "fill", "food?", "fill?"))]
        rng.shuffle(mid)
        secs = [(None, r("loc", "pop?", "fill", "fill?")), *mid, (H("nature"), r("animal", "elev?", "fill", "fill?"))]
        extra = [pick(TOWN_LIST, c)] if rng.random() < 0.6 else []
        spare = r("fill", "craft", "loc", "food", "fill", "founded", "landmark", "pop", "fill")
    elif kind == "person":
        c = person_ctx(subj)
        r = realizer(rng, EN, c, used)
        secs = [(None, r("p_intro", "p_view?", "quote")), (H("person"), r("p_born", "p_teacher", "loc?", "founded?", "fill?")),
                (H("work2"), r("p_work", "p_day", "p_prize?", "craft?", "quote?", "market?")),
                (None, r("festival", "food?", "fill", "fill?")), (H("future"), r("future", "quote", "fill?"))]
        spare = r("fill", "p_view", "loc", "food", "craft", "fill", "quote", "landmark")
    elif kind == "animal":
        t, animal = subj
        towns = next(rv for rv in w["rivers"] if rv["R"] == t["R"])["towns"]
        c = town_ctx(t | dict(animal=animal)) | dict(T2=towns[-1]["T"] if towns[-1] is not t else towns[0]["T"], count=fixed(animal[0] + t["R"], 6, 180),
                                                     since=fixed(animal[0] + t["R"], 1975, 2015), trend=["risen", "grown slowly", "fallen"][fixed(animal[1] + t["R"], 0, 2)])
        ra, r = realizer(rng, EN_ANIMAL, c, used), realizer(rng, EN, c, used)
        secs = [(None, ra("intro", "habitat", "fill?")), (H("nature"), ra("diet", "body", "body?", "habits", "fill?")),
                (None, ra("habits?", "count", "fill") + r("loc?")), (None, ra("count?", "advice", "advice?", "fill?") + r("fill?"))]
        extra = [pick(ANIMAL_LIST, c)] if rng.random() < 0.5 else []
        spare = ra("intro", "diet", "body", "count", "advice", "habitat", "fill", "fill") + r("fill")
    elif kind == "food":
        c = person_ctx(rng.choice([p for p in w["people"] if p["town"] is subj] or w["people"])) | town_ctx(subj)
        rf, r = realizer(rng, EN_FOOD, c, used), realizer(rng, EN, c, used)
        secs = [(None, rf("intro", "intro", "history?") + r("loc?")), (H("history"), rf("history", "history?", "fill") + r("founded?", "craft?")),
                (None, rf("season", "season?", "tip", "fill?") + r("festival?")), (None, rf("tip?", "fill", "fill?") + r("market?", "fill?"))]
        extra = [("ul", [f"{fixed(c['food'], 3, 12) * rng.choice([10, 20])} grams of {c['ing1']}",
                         f"{fixed(c['food'] + 'x', 2, 6)} {rng.choice(['spoons', 'handfuls'])} of {c['ing2']}",
                         *rng.sample(["a pinch of salt", "a little butter", "an egg", "a cup of milk", "a bunch of parsley", "black pepper"], 2)])]
        spare = rf("intro", "history", "season", "tip", "fill", "fill") + r("fill", "food", "loc")
    elif kind == "event":
        t, e = subj
        c = town_ctx(t) | event_ctx(t, e) | dict(per=f"{rng.choice(FEMALE + MALE)} {rng.choice(SURNAMES)}")
        c["equote"] = rng.choice(EQUOTES).format_map(c)
        rv, r = realizer(rng, EN_EVENT, c, used), realizer(rng, EN, c, used)
        secs = [(None, rv("intro", "detail", "intro?")), (None, rv("detail", "detail?", "quote") + r("loc?", "fill?")),
                (None, rv("after", "after?") + r("founded?", "pop?", "fill")), (None, rv("memory", "memory?") + r("landmark?", "fill", "fill?"))]
        spare = rv("intro", "detail", "after", "memory") + r("fill", "craft", "loc", "fill")
    elif kind == "river":
        towns = subj["towns"]
        c = town_ctx(towns[0]) | dict(T2=towns[-1]["T"], length=subj["length"], hills=subj["hills"], Gs=" and ".join(subj["regions"]))
        rr, r = realizer(rng, EN_RIVER, c, used), realizer(rng, EN, c, used)
        tsents = [realize(rng, EN_RIVER, "town", town_ctx(t), used) for t in towns]
        tsents += [realize(rng, EN, rng.choice(["craft", "landmark", "festival", "food"]), town_ctx(t), used) for t in rng.sample(towns, min(3, len(towns)))]
        secs = [(None, rr("intro", "intro?") + r("animal", "fill?")), ("[Towns Along the River|From Town to Town]", tsents), (None, rr("walk", "walk?") + r("fill", "fill?", "food?"))]
        cols = [0] + sorted(rng.sample(range(1, 5), 2))
        rows = [["Town", "Kilometre", "Founded", "Population", "Main trade"]] + [[t["T"], str(t["km"]), str(t["Y"]), f"{t['pop']:,}", t["craft"]] for t in towns]
        extra = [("table", [[row[i] for i in cols] for row in rows])]
        spare = rr("walk", "town") + r("fill", "loc", "landmark", "fill", "festival")
    elif kind == "compare":
        a, b = subj
        ca, cb = town_ctx(a), town_ctx(b)
        c = ca | {k + "2": v for k, v in cb.items()} | dict(older="older" if a["Y"] < b["Y"] else "younger", ydiff=abs(a["Y"] - b["Y"]),
                                                            befaft="before" if a["Y"] < b["Y"] else "after", cmp2="larger" if a["pop"] > b["pop"] else "smaller")
        cmp = [say(rng, s, c) for s in rng.sample(EN_CMP, 4)]
        ra, rb = realizer(rng, EN, ca, used), realizer(rng, EN, cb, used)
        secs = [(None, ra("loc") + rb("loc") + cmp[:1]), (None, ra("founded", "craft", "landmark?") + cmp[1:3]), (None, rb("founded", "craft", "landmark?") + cmp[3:]),
                (None, ra("festival?", "food", "fill") + rb("festival?", "food")), (None, ra("fill?") + rb("fill", "pop?"))]
        rows = [["Founded", str(a["Y"]), str(b["Y"])], ["Population", ca["P"], cb["P"]], ["River", a["R"], b["R"]],
                ["Main trade", a["craft"], b["craft"]], ["Festival", a["fest"], b["fest"]]]
        extra = [("table", [["", a["T"], b["T"]]] + rng.sample(rows, 3))] if rng.random() < 0.7 else []
        spare = ra("pop", "market", "elev", "fill") + rb("market", "elev", "neighbour", "fill")
    else:  # craft: the steps either as a list or told in sentences, not both
        craft, t = subj
        c = town_ctx(t) | {f"s{i}": s for i, s in enumerate(craft[4])}
        rc, r = realizer(rng, EN_CRAFT, c, used), realizer(rng, EN, c, used)
        as_list = rng.random() < 0.5
        secs = [(None, rc("intro", "resource", "products?") + r("loc?")), (H("work"), ([] if as_list else rc("steps", "steps")) + rc("fill", "fill?")),
                (None, rc("products", "intro?", "fill?") + r("craft", "founded?", "fill"))]
        extra = [("ul", [s[0].upper() + s[1:] for s in craft[4]])] if as_list else []
        spare = rc("intro", "products", "fill", "fill") + r("fill", "craft", "market", "food")
    title, blocks = titlecase(say(rng, TITLES[kind], c)), []
    for i, (head, sents) in enumerate(secs):  # every section gets 3+ sentences, topped up with more on its topic
        sents += [realize(rng, *rng.choice(TOPUP[kind]), c, used) for _ in range(rng.randint(3, 6) - len(sents))]
        blocks += ([("h2", say(rng, head, c))] if head else []) + paragraphs(rng, sents) + (extra if i == 1 else [])
    return dict(kind=kind, title=title, blocks=blocks, spare=spare)


def block_lines(blocks):
    for kind, x in blocks:
        if kind == "h2":
            yield x
        elif kind == "p":
            yield " ".join(x)
        elif kind == "table":
            yield from (" | ".join(row) for row in x)
        else:  # ul, sol
            yield from x


def body_text(blocks):
    """The article text as planted.json records it: one line per heading, paragraph, list item or table row."""
    return "\n".join(block_lines(blocks))


# ----------------------------------------------------------------------------- math word problems
ITEMS = [("loaf", "loaves", "bakes"), ("jar of honey", "jars of honey", "fills"), ("basket of apples", "baskets of apples", "picks"),
         ("fish", "fish", "catches"), ("egg", "eggs", "collects"), ("candle", "candles", "makes"), ("bowl", "bowls", "makes"),
         ("scarf", "scarves", "knits"), ("rope", "ropes", "twists"), ("cheese", "cheeses", "makes"), ("pie", "pies", "bakes")]


def problem(rng, w, small=False):
    """One GSM8K-style word problem about the world's people and places: (question, solution lines, answer).

    small=True narrows the operands so every step is a one-digit table fact (factors 2-9, sums of
    two digits, a product minus a digit...): the demo's SFT/RL tasks, where a 2M-parameter model
    can know the facts and the errors left are choices it makes (examples/make_tasks.py). The
    crawl is written with small=False; its random draws are unchanged by the option."""
    female = rng.random() < 0.5
    n, pro, pos = rng.choice(FEMALE if female else MALE), *(("she", "her") if female else ("he", "his"))
    Pro = pro.capitalize()
    t, t2 = rng.sample(w["towns"], 2)
    one, many, verb = rng.choice(ITEMS)
    kind = rng.randrange(9)
    if kind == 0:
        a, b = (rng.randint(1, 5), rng.randint(1, 4)) if small else (rng.randint(5, 30), rng.randint(5, 30))
        c = rng.randint(1 if small else 2, a + b - 1)
        q = f"{n} {verb} {a} {many} on Monday and {b} on Tuesday. {Pro} sells {c} of them at the market in {t['T']}. How many {many} does {n} have left?"
        steps = [f"On the two days {n} {verb} {a} + {b} = {a + b} {many}.", f"After selling {c}, {pro} has {a + b} - {c} = {a + b - c} {many} left."]
    elif kind == 1:
        a, b = (rng.randint(2, 9), rng.randint(2, 9)) if small else (rng.randint(3, 15), rng.randint(4, 24))
        q = f"A barge on the {t['R']} carries {a} crates, and each crate holds {b} {many}. How many {many} does the barge carry?"
        steps = [f"The barge carries {a} * {b} = {a * b} {many}."]
    elif kind == 2:
        p, k = (rng.randint(2, 4), rng.randint(2, 4)) if small else (rng.randint(2, 9), rng.randint(2, 8))
        note = next(x for x in ((10, 20) if small else (20, 50, 100)) if x > p * k)
        q = f"At the {t['mday']} market in {t['T']}, one {one} costs {p} coins. {n} buys {k} {many} and pays with a {note}-coin note. How much change does {n} get?"
        steps = [f"{k} {many} cost {k} * {p} = {k * p} coins.", f"The change is {note} - {k * p} = {note - k * p} coins."]
    elif kind == 3:
        each, b = (rng.randint(2, 9), rng.randint(2, 9)) if small else (rng.randint(2, 12), rng.randint(2, 9))
        q = f"{n} has {each * b} {many} and shares them equally among {b} friends from {t['T']}. How many {many} does each friend get?"
        steps = [f"Each friend gets {each * b} / {b} = {each} {many}."]
    elif kind == 4:
        h, d, pay = (rng.randint(2, 3), rng.randint(2, 3), rng.randint(2, 9)) if small else (rng.randint(2, 8), rng.randint(2, 6), rng.randint(3, 12))
        q = f"{n} works as {an(t['worker'])} in {t['T']}. {Pro} works {h} hours a day for {d} days and earns {pay} coins an hour. How many coins does {n} earn?"
        steps = [f"{n} works {h} * {d} = {h * d} hours.", f"{Pro} earns {h * d} * {pay} = {h * d * pay} coins."]
    elif kind == 5:
        s, x, y = (rng.randint(2, 9), rng.randint(1, 4), rng.randint(1, 5)) if small else (rng.randint(3, 12), rng.randint(1, 4), rng.randint(1, 4))
        q = f"A ferry on the {t['R']} travels {s} kilometres every hour. It sails for {x} hours in the morning and {y} hours in the afternoon. How many kilometres does it travel in total?"
        steps = [f"The ferry sails {x} + {y} = {x + y} hours.", f"It travels {x + y} * {s} = {(x + y) * s} kilometres."]
    elif kind == 6:
        a, b = sorted(rng.sample(range(2, 10) if small else range(8, 90), 2), reverse=True)
        q = f"The market in {t['T']} has {a} stalls and the market in {t2['T']} has {b} stalls. How many more stalls does the market in {t['T']} have?"
        steps = [f"{t['T']} has {a} - {b} = {a - b} more stalls."]
    elif kind == 7:
        if small:  # per * d - g = k * bags, g a digit
            k, bags = rng.randint(2, 5), rng.randint(2, 5)
            d = rng.randint(2, 5)
            per = -(-(k * bags + 1) // d)  # the smallest daily count that leaves something to give
            per += rng.randint(0, max(0, (k * bags + 9) // d - per))
            per = max(2, per)
        else:
            k, d, per, bags = rng.randint(2, 6), rng.randint(2, 7), rng.randint(3, 9), rng.randint(2, 9)
        while per * d - k * bags <= 0:
            per += 2
        g = per * d - k * bags
        q = f"{n} {verb} {per} {many} every day for {d} days. {Pro} gives {g} of them to {rng.choice(MALE + FEMALE)} and packs the rest into boxes of {k}. How many boxes does {n} fill?"
        steps = [f"{n} has {per} * {d} = {per * d} {many}.", f"After giving away {g}, {per * d} - {g} = {per * d - g} are left.", f"{per * d - g} / {k} = {bags} boxes."]
    else:
        age, m, y = (rng.randint(2, 9), rng.randint(2, 9), rng.randint(1, 9)) if small else (rng.randint(6, 14), rng.randint(4, 7), rng.randint(2, 10))
        q = f"{n} is {age} years old. {pos.capitalize()} grandmother in {t['T']} is {m} times as old. How old will the grandmother be in {y} years?"
        steps = [f"The grandmother is {age} * {m} = {age * m} years old.", f"In {y} years she will be {age * m} + {y} = {age * m + y}."]
    ans = int(re.search(r"= (\d+)", steps[-1]).group(1))  # the last step's result is the answer
    return q, steps + [f"#### {ans}"], ans


def math_page(rng, w, i):
    topic = rng.choice(["Mixed Practice", "Market Maths", "Word Problems", "Two-Step Problems", "Everyday Arithmetic"])
    intro = say(rng, "[Work through|Try] these [problems|questions] [on your own|with a pencil and paper] before you [read|look at] the [worked solutions|answers].", {})
    probs = [problem(rng, w) for _ in range(rng.randint(3, 8))]
    blocks = [("p", [intro])] + [b for k, (q, sol, _) in enumerate(probs) for b in (("h2", f"Problem {k + 1}"), ("p", [q]), ("sol", sol))]
    return dict(kind="math", title=f"{topic}: Set {i + 1}", blocks=blocks, problems=probs)


# ----------------------------------------------------------------------------- other languages
# Real vocabulary and grammar per language, so fastText lid.176 is sure of the language. Slots
# only take forms that fit their place (Polish river names in the instrumental, months in the
# locative, numbers that keep the genitive plural, ...).
LANGS = {
    "de": dict(a="Linden Eichen Wald Stein Rosen Falken Birken Hasel Tann Ulmen Weiden Buchen".split(), b="au berg dorf bach feld hausen heim tal".split(),
               rivers="Lauter Wiese Eller Sulm Brenz Wipper".split(), sep=".", q="„{quote}“",
               month="Januar Februar März April Mai Juni Juli August September Oktober November Dezember".split(), day="Montag Dienstag Mittwoch Donnerstag Freitag Samstag".split(),
               craft=["vom Fischfang", "vom Weinbau", "von der Töpferei", "vom Bootsbau", "von der Landwirtschaft", "vom Holzhandel"],
               food=["der Apfelkuchen mit Honig", "die Kartoffelsuppe mit Speck", "das dunkle Roggenbrot", "der geräucherte Fisch aus dem Fluss", "die Zwiebeltorte"],
               names_f="Anna Katharina Lena Sophie Maria Julia Hannah Lea".split(), names_m="Thomas Michael Stefan Jonas Lukas Peter Klaus Felix".split(),
               surnames="Müller Schneider Fischer Weber Becker Hoffmann Schäfer Koch".split(),
               quotes=["Hier kennt jeder jeden", "Ohne den Fluss gäbe es unsere Stadt nicht", "Im Sommer ist {T} der schönste Ort der Welt", "Die jungen Leute kommen langsam zurück",
                       "Man muss die Geschichte kennen, um die Stadt zu verstehen"],
               qf="{q}, sagt {name}, die seit {years} Jahren als [Lehrerin|Bäckerin|Ärztin|Buchhändlerin] in {T} arbeitet.",
               qm="{q}, sagt {name}, der seit {years} Jahren als [Lehrer|Bäcker|Arzt|Fischer] in {T} arbeitet.",
               title="[{T}: Eine Stadt am Fluss {R}|Ein Besuch in {T}|{T} und seine Geschichte|Unterwegs in {T}|Was {T} so besonders macht]",
               s=["{T} ist eine [kleine|alte|ruhige] Stadt am Fluss {R} und wurde im Jahr {Y} gegründet.", "Heute [wohnen|leben] [ungefähr|etwa|rund] {P} Menschen in {T}.",
                  "Die Altstadt mit ihren [engen Gassen|alten Fachwerkhäusern] gehört zu den schönsten Orten der [ganzen Region|Gegend].",
                  "Jeden {day} findet auf dem Marktplatz ein Wochenmarkt statt, auf dem [Bauern|Händler] [Obst, Gemüse und Käse|Brot, Honig und frische Eier] verkaufen.",
                  "Im {month} feiern die Einwohner ein großes Fest mit [Musik und Tanz|Musik, Tanz und vielen Ständen].", "[Viele|Zahlreiche] Familien leben seit [Generationen|vielen Jahrzehnten] {craft}.",
                  "Die alte Brücke über den Fluss wurde im Jahr {Y2} gebaut und ist {n} Meter lang.", "Zu den [bekanntesten|beliebtesten] Spezialitäten [der Stadt|der Region] gehört {food}.",
                  "Wer die Stadt besuchen möchte, sollte sich Zeit für [das Museum|die Kirche|den Schlossgarten] und [den Hafen|das Rathaus|die Stadtmauer] nehmen.",
                  "Nach dem großen Hochwasser im Jahr {Y3} wurde am Ufer eine hohe Mauer [errichtet|gebaut].",
                  "Im Winter ist es hier oft [kalt und neblig|feucht und windig], aber im Sommer sind die Tage [lang und warm|sonnig und mild].",
                  "Die Bahnstrecke nach {T2} wurde im Jahr {Y4} eröffnet, und seitdem kommen [mehr Besucher|viele Ausflügler] in die Stadt.",
                  "Das Rathaus steht [direkt neben der Kirche|am Marktplatz] und wurde nach einem [großen|schweren] Brand neu aufgebaut.",
                  "Im Wald oberhalb der Stadt leben [Füchse, Rehe und viele Vogelarten|Dachse, Hasen und Eulen].", "Die Schule der Stadt besuchen {n2} Schülerinnen und Schüler.",
                  "Von {T} nach {T2} sind es nur {k} Kilometer, und der Weg führt [am Fluss entlang|durch Wiesen und Felder].",
                  "[Die Bewohner|Die Menschen hier|Viele Einwohner] sind stolz auf ihre [Geschichte|Traditionen] und erzählen gern von [früheren Zeiten|alten Sagen].", "[Am Abend|Nach der Arbeit|Am Wochenende] treffen sich viele [Menschen|Familien|Nachbarn] in den [kleinen Gasthäusern|Cafés] am Ufer.",
                  "Früher war {T} vor allem für [seinen Hafen|seine Mühlen|seinen Markt] bekannt, heute leben die meisten Menschen vom Tourismus.",
                  "Der Bürgermeister [hofft|glaubt], dass [bald|in den nächsten Jahren] [neue Wohnungen gebaut werden|eine neue Schule gebaut wird|ein Radweg nach {T2} gebaut wird].",
                  "Im Jahr {Y} lebten hier nur [wenige|einige] [Fischer und Bauern|Familien|Handwerker und Bauern].", "Auf dem Fluss {R} fahren im Sommer kleine Boote mit [Touristen|Ausflüglern].",
                  "[Die Kirche|Die alte Kapelle] im Zentrum der Stadt ist über {age} Jahre alt."],
               chrome=dict(cookie="Wir verwenden Cookies, um unsere Website für Sie zu verbessern. Mit der Nutzung der Seite stimmen Sie der Verwendung von Cookies zu.",
                           accept="Alle akzeptieren", related="Weitere Artikel", newsletter="Newsletter abonnieren", subscribe="Anmelden", rights="Alle Rechte vorbehalten",
                           privacy="Datenschutz", about="Über uns", contact="Kontakt", by="Von", nav="Startseite|Region|Kultur|Reisen|Sport")),
    "fr": dict(a="Mont Belle Roche Font Ville Beau Clair Pont Val Champ".split(), b="fort ville mont lieu bois vert".split(), rivers="Ardelle Vionne Sorelle Brévanne Loubière".split(),
               sep=" ", q="« {quote} »", month="janvier février mars avril mai juin juillet août septembre octobre novembre décembre".split(),
               day="lundi mardi mercredi jeudi vendredi samedi".split(),
               craft=["de la pêche", "de la vigne", "de la poterie", "de la construction de bateaux", "de l'agriculture", "du commerce du bois"],
               food=["la tarte aux pommes et au miel", "la soupe aux poireaux", "le pain de seigle", "la truite fumée", "le gâteau aux noix"],
               names_f="Marie Camille Julie Claire Sophie Élise Manon Louise".split(), names_m="Pierre Jean Luc Antoine Nicolas Julien Thomas Hugo".split(),
               surnames="Martin Bernard Dubois Moreau Laurent Lefèvre Girard Roux".split(),
               quotes=["Ici, tout le monde se connaît", "Sans la rivière, notre ville n'existerait pas", "En été, {T} est le plus bel endroit du monde", "Les jeunes reviennent peu à peu",
                       "Il faut connaître l'histoire pour comprendre la ville"],
               qf="{q}, explique {name}, qui travaille comme [institutrice|boulangère|infirmière|libraire] à {T} depuis {years} ans.",
               qm="{q}, explique {name}, qui travaille comme [instituteur|boulanger|infirmier|pêcheur] à {T} depuis {years} ans.",
               title="[{T}, une ville au bord de la rivière {R}|Une visite à {T}|{T} et son histoire|Promenade à {T}|Ce qui rend {T} unique]",
               s=["{T} est une [petite|vieille|paisible] ville située au bord de la rivière {R}, fondée en {Y}.", "Aujourd'hui, [environ|près de] {P} personnes habitent dans la commune.",
                  "La vieille ville, avec ses [rues étroites|maisons anciennes], est l'un des plus beaux endroits de [toute la région|la vallée].",
                  "Chaque {day}, un marché se tient sur la place principale, où [les agriculteurs|les producteurs] vendent [des fruits, des légumes et du fromage|du pain, du miel et des œufs frais].",
                  "En {month}, les habitants célèbrent une grande fête avec [de la musique et des danses|de la musique, des danses et de nombreux stands].",
                  "Le vieux pont sur la rivière a été construit en {Y2} et mesure {n} mètres de long.", "Depuis [des générations|plus d'un siècle], [de nombreuses|beaucoup de] familles vivent {craft}.",
                  "Ceux qui visitent la ville devraient prendre le temps de voir [le musée|l'église|le jardin du château] et [le port|la mairie|les remparts].",
                  "Après la grande crue de {Y3}, un [haut|long] mur a été construit le long de la rive.",
                  "En hiver, il fait souvent [froid et humide|gris et venteux], mais en été les journées sont [longues et chaudes|ensoleillées et douces].",
                  "La ligne de chemin de fer vers {T2} a été ouverte en {Y4}, et depuis, [les visiteurs sont plus nombreux|beaucoup de touristes viennent en été].",
                  "Parmi les spécialités [de la ville|de la région|locales], on trouve {food}.", "La mairie se trouve [juste à côté de l'église|sur la place du marché] et a été reconstruite après un [grand|terrible] incendie.",
                  "Dans la forêt au-dessus de la ville vivent [des renards, des chevreuils et de nombreux oiseaux|des blaireaux, des lièvres et des chouettes].",
                  "L'école de la ville accueille {n2} élèves.", "De {T} à {T2}, il n'y a que {k} kilomètres, et le chemin [suit la rivière|traverse les prés et les champs].",
                  "[Les habitants|Les gens d'ici] sont fiers de leur [histoire|patrimoine] et aiment raconter [le passé|les anciennes légendes].",
                  "[Le soir|Le week-end|Après le travail], beaucoup de [gens|familles] se retrouvent dans les [petites auberges|cafés] au bord de l'eau.",
                  "Autrefois, la ville était surtout connue pour [son port|ses moulins|son marché] ; aujourd'hui, la plupart des habitants vivent du tourisme.",
                  "Le maire [espère|pense] que [de nouveaux logements seront construits|une nouvelle école sera construite|une piste cyclable vers {T2} sera construite] [bientôt|dans les prochaines années].",
                  "En {Y}, seuls quelques [pêcheurs et paysans|artisans|paysans et leurs familles] vivaient ici.", "En été, de petits bateaux transportent [les touristes|les promeneurs] sur la rivière {R}.",
                  "[L'église|La vieille chapelle] du centre-ville a plus de {age} ans."],
               chrome=dict(cookie="Nous utilisons des cookies pour améliorer votre expérience sur notre site. En poursuivant votre navigation, vous acceptez leur utilisation.",
                           accept="Tout accepter", related="À lire aussi", newsletter="Abonnez-vous à notre lettre d'information", subscribe="S'inscrire", rights="Tous droits réservés",
                           privacy="Confidentialité", about="Qui sommes-nous", contact="Contact", by="Par", nav="Accueil|Région|Culture|Voyages|Sports")),
    "es": dict(a="Val Torre Fuente Monte Villa Peña Campo Casa".split(), b="verde alta real blanca seca mayor nueva llana".split(), rivers="Arlanza Valdora Cerena Arandilla Tajonar".split(),
               sep=".", q="«{quote}»", month="enero febrero marzo abril mayo junio julio agosto septiembre octubre noviembre diciembre".split(),
               day="lunes martes miércoles jueves viernes sábado".split(),
               craft=["de la pesca", "de la vid", "de la alfarería", "de la construcción de barcas", "de la agricultura", "del comercio de madera"],
               food=["la tarta de manzana y miel", "la sopa de ajo", "el pan de centeno", "la trucha ahumada", "el queso de oveja"],
               names_f="María Lucía Carmen Elena Isabel Ana Paula Sofía".split(), names_m="Javier Carlos Miguel Pablo Antonio Diego Manuel Andrés".split(),
               surnames="García Martínez López Sánchez Romero Navarro Torres Ruiz".split(),
               quotes=["Aquí todo el mundo se conoce", "Sin el río, nuestra ciudad no existiría", "En verano, {T} es el lugar más bonito del mundo",
                       "Los jóvenes están volviendo poco a poco", "Hay que conocer la historia para entender la ciudad"],
               qf="{q}, dice {name}, que trabaja como [maestra|panadera|médica|librera] en {T} desde hace {years} años.",
               qm="{q}, dice {name}, que trabaja como [maestro|panadero|médico|pescador] en {T} desde hace {years} años.",
               title="[{T}, una ciudad a orillas del río {R}|Una visita a {T}|{T} y su historia|Paseo por {T}|Lo que hace especial a {T}]",
               s=["{T} es una [pequeña|antigua|tranquila] ciudad situada a orillas del río {R}, fundada en {Y}.", "Hoy en día viven en el municipio [unas|cerca de] {P} personas.",
                  "El casco antiguo, con sus [calles estrechas|casas de piedra], es uno de los lugares más bonitos de [toda la región|la comarca].",
                  "Cada {day} se celebra un mercado en la plaza mayor, donde [los agricultores|los productores] venden [frutas, verduras y queso|pan, miel y huevos frescos].",
                  "En {month}, los vecinos celebran una gran fiesta con [música y bailes|música, bailes y muchos puestos].",
                  "El viejo puente sobre el río se construyó en {Y2} y mide {n} metros de largo.", "Desde hace [generaciones|más de un siglo], muchas familias viven {craft}.",
                  "Quien visite la ciudad debería dedicar tiempo [al museo|a la iglesia|a los jardines del castillo] y [al puerto|al ayuntamiento|a la muralla].",
                  "Después de la gran inundación de {Y3}, se levantó un muro [alto|largo] a lo largo de la orilla.",
                  "En invierno suele hacer [frío y hay niebla|frío y mucho viento], pero en verano los días son [largos y cálidos|soleados y suaves].",
                  "La línea de ferrocarril hasta {T2} se inauguró en {Y4}, y desde entonces [llegan más visitantes|vienen muchos turistas en verano].",
                  "Entre las especialidades [de la ciudad|de la comarca|locales] destaca {food}.", "El ayuntamiento está [justo al lado de la iglesia|en la plaza mayor] y fue reconstruido después de un [gran|terrible] incendio.",
                  "En el bosque que hay sobre la ciudad viven [zorros, corzos y muchas especies de aves|tejones, liebres y búhos].", "La escuela de la ciudad tiene {n2} alumnos.",
                  "De {T} a {T2} hay solo {k} kilómetros, y el camino [sigue el curso del río|atraviesa prados y campos].",
                  "[Los habitantes|Los vecinos] están orgullosos de su [historia|patrimonio] y les gusta [hablar del pasado|contar viejas leyendas].",
                  "[Por la tarde|Los fines de semana|Después del trabajo], mucha gente se reúne en [las pequeñas tabernas|los cafés] junto al río.",
                  "Antes, la ciudad era conocida sobre todo por [su puerto|sus molinos|su mercado]; hoy la mayoría de los habitantes vive del turismo.",
                  "El alcalde [espera|cree] que [pronto|en los próximos años] [se construirán nuevas viviendas|se construirá una nueva escuela|se construirá un carril bici hasta {T2}].",
                  "En {Y}, aquí solo vivían unos pocos [pescadores y campesinos|artesanos|campesinos con sus familias].", "En verano, pequeñas barcas llevan a [los turistas|los excursionistas] por el río {R}.",
                  "[La iglesia|La vieja capilla] del centro tiene más de {age} años."],
               chrome=dict(cookie="Utilizamos cookies propias y de terceros para mejorar nuestros servicios. Si continúa navegando, consideramos que acepta su uso.", accept="Aceptar todas",
                           related="Noticias relacionadas", newsletter="Suscríbase a nuestro boletín", subscribe="Suscribirse", rights="Todos los derechos reservados",
                           privacy="Política de privacidad", about="Quiénes somos", contact="Contacto", by="Por", nav="Portada|Región|Cultura|Viajes|Deportes")),
    "pl": dict(a="Brzoz Dęb Jawor Lip Olsz Grab Wierzb Sosn Kalin".split(), b="owo ówka nica".split(), rivers="Bystrzyna Olszanka Modrza Lesznica Wierzbianka".split(), sep=" ",
               q="„{quote}”", month=["w kwietniu", "w maju", "w czerwcu", "w lipcu", "w sierpniu", "we wrześniu", "w październiku"],
               day=["w każdy poniedziałek", "w każdy wtorek", "w każdą środę", "w każdy czwartek", "w każdy piątek", "w każdą sobotę"],
               craft=["z rybołówstwa", "z uprawy winorośli", "z garncarstwa", "z budowy łodzi", "z rolnictwa", "z handlu drewnem"],
               food=["szarlotka z miodem", "zupa ogórkowa", "chleb żytni na zakwasie", "wędzony pstrąg", "kapuśniak z grzybami"],
               names_f="Anna Katarzyna Magdalena Agnieszka Joanna Zofia Małgorzata Ewa".split(), names_m="Piotr Tomasz Krzysztof Andrzej Paweł Marek Jan Michał".split(),
               surnames="Nowak Wójcik Kaczmarek Mazur Krawczyk Zając Król Wieczorek".split(),
               quotes=["Tutaj wszyscy się znają", "Bez rzeki nasze miasto by nie istniało", "Latem to najpiękniejsze miejsce na świecie", "Młodzi ludzie powoli wracają",
                       "Trzeba znać historię, żeby zrozumieć to miasto"],
               qf="{q} – mówi {name}, która od {years} lat pracuje w mieście jako [nauczycielka|piekarka|lekarka|bibliotekarka].",
               qm="{q} – mówi {name}, który od {years} lat pracuje w mieście jako [nauczyciel|piekarz|lekarz|rybak].",
               title="[{T} – miasto nad rzeką {Ri}|Wizyta w mieście {T}|Historia miasta {T}|Spacer po mieście {T}|Co warto zobaczyć w mieście {T}]",
               s=["{T} to [niewielkie|stare|spokojne] miasto nad rzeką {Ri}, założone w {Y} roku.", "Obecnie mieszka tu około {P} osób.",
                  "Stare miasto z [wąskimi uliczkami|zabytkowymi kamienicami] jest jednym z najpiękniejszych miejsc w [całym regionie|okolicy].",
                  "{day} na rynku odbywa się targ, na którym [rolnicy|okoliczni gospodarze] sprzedają [owoce, warzywa i ser|chleb, miód i świeże jajka].",
                  "{month} mieszkańcy obchodzą wielkie święto z [muzyką i tańcami|muzyką, tańcami i straganami].", "Stary most na rzece zbudowano w {Y2} roku i ma on {n} metrów długości.",
                  "[Wiele|Sporo] rodzin od [pokoleń|dziesięcioleci] utrzymuje się {craft}.", "Kto chce zwiedzić miasto, powinien znaleźć czas na [muzeum|kościół|park przy zamku] i [port|ratusz|mury obronne].",
                  "Po wielkiej powodzi w {Y3} roku na brzegu rzeki zbudowano [wysoki|długi] mur.", "Zimą bywa tu [zimno i mglisto|zimno i wietrznie], ale latem dni są [długie i ciepłe|słoneczne i łagodne].",
                  "Linię kolejową do sąsiedniego miasta otwarto w {Y4} roku i od tego czasu [przyjeżdża tu więcej turystów|latem przyjeżdża wielu gości].",
                  "Jednym z [przysmaków|najbardziej znanych przysmaków] [miasta|regionu] jest {food}.", "Ratusz stoi [tuż obok kościoła|przy rynku] i został odbudowany po [wielkim|groźnym] pożarze.",
                  "W lesie nad miastem żyją [lisy, sarny i wiele gatunków ptaków|borsuki, zające i sowy].", "Do miejscowej szkoły chodzi {n2} uczniów.",
                  "Do sąsiedniego miasta jest tylko {k} kilometrów, a droga prowadzi [wzdłuż rzeki|przez łąki i pola].",
                  "[Mieszkańcy|Miejscowi] są dumni ze swojej [historii|tradycji] i chętnie opowiadają o [dawnych czasach|starych legendach].",
                  "[Wieczorem|W weekendy|Po pracy] wiele osób spotyka się w [małych gospodach|kawiarniach] nad brzegiem rzeki.",
                  "Dawniej miasto słynęło przede wszystkim z [portu|młynów|targu], a dziś większość mieszkańców żyje z turystyki.",
                  "Burmistrz [ma nadzieję|uważa], że [wkrótce|w najbliższych latach] [powstaną nowe mieszkania|powstanie nowa szkoła|powstanie ścieżka rowerowa wzdłuż rzeki].",
                  "W {Y} roku mieszkało tu tylko kilku [rybaków i rolników|rzemieślników|rolników z rodzinami].", "Latem po rzece pływają małe łodzie z [turystami|wycieczkami].", "[Kościół|Stara kaplica] w centrum miasta ma ponad {age} lat."],
               chrome=dict(cookie="Ta strona używa plików cookies. Korzystając ze strony, wyrażasz zgodę na ich używanie zgodnie z aktualnymi ustawieniami przeglądarki.",
                           accept="Akceptuję", related="Czytaj także", newsletter="Zapisz się do newslettera", subscribe="Zapisz się", rights="Wszelkie prawa zastrzeżone",
                           privacy="Polityka prywatności", about="O nas", contact="Kontakt", by="Autor:", nav="Strona główna|Region|Kultura|Podróże|Sport")),
    "zh": dict(a="柳 青 白 松 桃 清 石 金".split(), b="溪镇 石镇 沙镇 林镇 源镇".split(), rivers=["清江", "白河", "碧水河"], sep="", q="“{quote}，”",
               month=[str(m) for m in range(1, 13)], day="一 二 三 四 五 六".split(), craft=["捕鱼", "种植葡萄", "制作陶器", "造船"], food=["苹果蜂蜜蛋糕", "熏鳟鱼", "黑麦面包"],
               names_f="王丽 刘芳 陈静 杨敏".split(), names_m="李明 张伟 赵强 黄涛".split(), surnames=[""],
               quotes=["这里的每个人都互相认识", "没有这条河，就没有我们的城市", "年轻人正在慢慢回来"], qf="{q}在这里当了{years}年老师的{name}说。", qm="{q}在这里当了{years}年医生的{name}说。",
               title="[{T}：一座河边的小城|走进{T}|{T}的历史与今天]",
               s=["{T}是一座位于{R}河畔的[小城|古城]，始建于{Y}年。", "目前，这里大约有{P}位居民。", "老城区的街道[狭窄而安静|两旁都是古老的房屋]，是整个地区最美丽的地方之一。",
                  "每逢星期{day}，镇上的广场都会举办集市，农民们在这里出售[水果、蔬菜和奶酪|面包、蜂蜜和鸡蛋]。", "每年{month}月，居民们都会举行盛大的节日活动，有音乐、舞蹈和许多小摊。",
                  "河上的老石桥建于{Y2}年，全长{n}米。", "许多家庭世世代代以{craft}为生。", "来这里旅游的人应该留出时间参观[博物馆|老教堂]和[港口|市政厅]。",
                  "{Y3}年的大洪水之后，人们在河岸上修建了一道高墙。", "这里冬天常常又冷又多雾，但夏天白天很长，也很温暖。", "{Y4}年，通往邻近城市的铁路开通了，从那以后游客越来越多。",
                  "当地最有名的特产是{food}。", "城市上方的森林里生活着狐狸、狍子和许多种鸟类。", "当地的学校有{n2}名学生。", "居民们为自己的历史感到自豪，也喜欢讲述过去的故事。",
                  "晚上，很多人会在河边的小饭馆里聚会。"],
               chrome=dict(cookie="本网站使用Cookie来改善您的浏览体验。继续浏览即表示您同意我们使用Cookie。", accept="全部接受", related="相关文章", newsletter="订阅我们的新闻简报",
                           subscribe="订阅", rights="版权所有", privacy="隐私政策", about="关于我们", contact="联系我们", by="作者：", nav="首页|本地|文化|旅游|体育")),
}


def lang_page(rng, code):
    """A town portrait in another language: 9-15 sentences of that language's grammar and a quote."""
    L = LANGS[code]
    t, t2 = (x[0].upper() + x[1:] for x in rng.sample([a + b for a in L["a"] for b in L["b"]], 2))
    y, river, pop, female = rng.randrange(1100, 1700), rng.choice(L["rivers"]), rng.randrange(12, 400) * 100, rng.random() < 0.5
    ctx = dict(T=t, T2=t2, R=river, Ri=river[:-1] + "ą", Y=y, Y2=rng.randrange(y + 50, 1900), Y3=rng.randrange(1700, 2000), Y4=rng.randrange(1850, 1930),
               P=f"{pop:,}".replace(",", L["sep"]), n=rng.randrange(6, 40) * 5, n2=rng.randrange(8, 80) * 10, k=rng.randrange(1, 9) * 5,
               day=rng.choice(L["day"]), month=rng.choice(L["month"]), craft=rng.choice(L["craft"]), food=rng.choice(L["food"]),
               age=(2024 - y) // 10 * 10, years=rng.randrange(5, 22), name=(rng.choice(L["names_f" if female else "names_m"]) + " " + rng.choice(L["surnames"])).strip())
    ctx["q"] = L["q"].format(quote=rng.choice(L["quotes"]).format_map(ctx))
    sents = [say(rng, s, ctx) for s in rng.sample(L["s"], rng.randint(9, 15))]
    sents.insert(rng.randrange(3, len(sents)), say(rng, L["qf" if female else "qm"], ctx))
    blocks = paragraphs(rng, sents)
    if code == "zh":  # Chinese runs sentences together without spaces
        blocks = [("p", ["".join(p)]) for _, p in blocks]
    return dict(kind="lang", lang=code, title=say(rng, L["title"], ctx), blocks=blocks)


# ----------------------------------------------------------------------------- sites and page chrome
SITE_KEYS = ("domain", "name", "p", "nav", "kinds", "url", "tag", "side_first")  # p: prefix of the site's CSS classes
SITES = [dict(zip(SITE_KEYS, s)) for s in [
    ("riverside-gazette.example", "The Riverside Gazette", "rg", "News|Towns|People|Nature|Food|Opinion", "town event person compare", "/{sec}/{y}/{m:02d}/{slug}-{id}/", "article", False),
    ("northvale-chronicle.example", "Northvale Chronicle", "nvc", "Home|Local|History|Business|Sport", "town event compare craft", "/{sec}/{slug}-{id}.html", "div", True),
    ("field-notes.example", "Field Notes", "fn", "Home|Birds|Mammals|Rivers|Walks|About", "animal river", "/notes/{id}/{slug}", "section", False),
    ("kitchen-ledger.example", "The Kitchen Ledger", "kl", "Recipes|Stories|Markets|Cooks|Shop", "food person", "/{y}/{m:02d}/{d:02d}/{slug}-{id}/", "article", False),
    ("valley-wanderer.example", "Valley Wanderer", "vw", "Destinations|Rivers|Towns|Itineraries|Tips", "river town compare", "/guide/{slug}?id={id}", "article", True),
    ("heritage-weekly.example", "Heritage Weekly", "hw", "Latest|History|Buildings|Crafts|Letters", "event town craft", "/story/{id}-{slug}", "div", False),
    ("craft-and-trade.example", "Craft & Trade", "ct", "Workshops|Makers|Materials|Events", "craft person", "/makers/{slug}-{id}/", "article", False),
    ("county-herald.example", "The County Herald", "ch", "News|Towns|People|Nature|Food|History", "town person animal food event river compare craft", "/{sec}/{id}/{slug}/", "article", True),
    ("wild-river-diary.example", "Wild River Diary", "wrd", "Diary|Species|Places|Photos", "animal river", "/{y}/{m:02d}/{slug}-{id}/", "section", False),
    ("people-of-the-vale.example", "People of the Vale", "pov", "Portraits|Trades|Kitchens|Archive", "person craft food", "/p/{id}/{slug}", "div", True),
]]
MATH_SITE = dict(zip(SITE_KEYS, ("sums-and-steps.example", "Sums & Steps", "ss", "Practice|Worksheets|Topics|Teachers", "math", "/practice/{slug}-{id}/", "article", False)))
LANG_SITES = {k: dict(zip(SITE_KEYS, s)) for k, s in {"de": ("heimat-kurier.example", "Heimat-Kurier", "hk", "", "lang", "/region/{slug}-{id}.html", "article", False),
              "fr": ("journal-des-vallees.example", "Le Journal des Vallées", "jdv", "", "lang", "/{y}/{m:02d}/{id}-{slug}/", "article", True),
              "es": ("diario-del-rio.example", "Diario del Río", "ddr", "", "lang", "/noticias/{id}/{slug}", "div", False),
              "pl": ("kurier-nadrzeczny.example", "Kurier Nadrzeczny", "kn", "", "lang", "/artykul/{id}/{slug}", "article", False),
              "zh": ("hexi-ribao.example", "河西日报", "hx", "", "lang", "/news/{id}.html", "div", True)}.items()}
EN_CHROME = dict(accept="Accept all", related="[Related stories|Most read|You may also like|More from us]", newsletter="[Get our newsletter|Stories in your inbox every Friday]",
                 subscribe="Subscribe", rights="All rights reserved", privacy="Privacy policy", about="About us", contact="Contact",
                 cookie="[We use cookies to improve your experience on our site.|This website uses cookies to give you the best experience.|We and our partners use cookies to personalise content and ads.] [By continuing to browse, you agree to our use of cookies.|You can change your settings at any time.]")


def render_blocks(blocks):
    e = lambda s: html.escape(s, quote=False)
    out = []
    for kind, x in blocks:
        if kind == "h2":
            out.append(f"<h2>{e(x)}</h2>")
        elif kind == "p":
            out.append(f"<p>{e(' '.join(x))}</p>")
        elif kind == "ul":
            out.append("<ul>" + "".join(f"<li>{e(i)}</li>" for i in x) + "</ul>")
        elif kind == "sol":
            out.append('<div class="solution">' + "".join(f"<p>{e(i)}</p>" for i in x) + "</div>")
        else:
            rows = ["<tr>" + "".join(f"<{td}>{e(c)}</{td}>" for c in row) + "</tr>" for row, td in zip(x, ["th"] + ["td"] * len(x))]
            out.append(f"<table><thead>{rows[0]}</thead><tbody>{''.join(rows[1:])}</tbody></table>")
    return "\n".join(out)


def render_page(rng, site, title, main_html, related, lang="en", byline=None, lang_attr=True, charset_meta='<meta charset="utf-8">'):
    """Wrap article HTML in the site's chrome: cookie banner, header + nav, sidebar, footer.
    main_html None gives a page that is all chrome."""
    ch = {k: say(rng, v, {}) for k, v in EN_CHROME.items()} if lang == "en" else LANGS[lang]["chrome"]
    p, e = site["p"], html.escape
    nav = "".join(f'<li><a href="/{slugify(n) or "home"}/">{e(n)}</a></li>' for n in (site["nav"] or ch["nav"]).split("|"))
    cookie = (f'<div id="{p}-cookie" class="cookie-banner consent" role="dialog"><p>{e(ch["cookie"])}</p>'
              f'<button class="accept">{e(ch["accept"])}</button> <a href="/privacy/">{e(ch["privacy"])}</a></div>')
    header = f'<header class="{p}-header"><a class="{p}-logo" href="/">{e(site["name"])}</a>\n<nav class="{p}-nav"><ul>{nav}</ul></nav></header>'
    by = f'<p class="{p}-byline">{e(byline)}</p>\n' if byline else ""
    tag = site["tag"]
    main = f'<main class="{p}-main">\n<{tag} class="{p}-story">\n<h1>{e(title)}</h1>\n{by}{main_html}\n</{tag}>\n</main>' if main_html is not None else ""
    links = "".join(f'<li><a href="{e(u)}">{e(t)}</a></li>' for u, t in related)
    aside = (f'<aside class="{p}-sidebar"><h3>{e(ch["related"])}</h3><ul>{links}</ul>\n'
             f'<div class="{p}-newsletter"><h4>{e(ch["newsletter"])}</h4><a class="button" href="/subscribe/">{e(ch["subscribe"])}</a></div></aside>')
    footer = (f'<footer class="{p}-footer"><ul><li><a href="/about/">{e(ch["about"])}</a></li><li><a href="/contact/">{e(ch["contact"])}</a></li>'
              f'<li><a href="/privacy/">{e(ch["privacy"])}</a></li></ul><p>&copy; 2024 {e(site["name"])}. {e(ch["rights"])}.</p></footer>')
    body = "\n".join([cookie, header, f'<div class="{p}-wrap">', *([aside, main] if site["side_first"] else [main, aside]), "</div>", footer])
    return (f'<!DOCTYPE html>\n<html{f" lang={chr(34)}{lang}{chr(34)}" if lang_attr else ""}>\n<head>\n{charset_meta}\n<title>{e(title)} | {e(site["name"])}</title>\n'
            f'<link rel="stylesheet" href="/static/{p}.css">\n</head>\n<body class="{p}-page">\n{body}\n</body>\n</html>\n')


def bare_page(title, body):
    """The markup of a throwaway site: no chrome, no article."""
    return f'<!DOCTYPE html>\n<html>\n<head>\n<meta charset="utf-8">\n<title>{html.escape(title)}</title>\n</head>\n<body>{body and chr(10) + body + chr(10)}</body>\n</html>\n'


# ----------------------------------------------------------------------------- junk
SPAM_TOPICS = [["cheap watches", "replica watches", "luxury watches sale", "buy watches online"], ["payday loans", "fast cash loans", "instant loan approval", "bad credit loans"],
               ["casino bonus", "free spins", "online casino", "best slots"], ["weight loss pills", "lose weight fast", "diet pills", "burn fat now"],
               ["cheap flights", "last minute deals", "hotel discounts", "travel deals"]]
SPAM_WORDS = ["", "", " online", " now", " cheap", " best", " deals", " 2024", " free", " top"]
LOREM = ("lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor incididunt ut labore et dolore magna aliqua ut enim ad minim veniam "
         "quis nostrud exercitation ullamco laboris nisi aliquip ex ea commodo consequat duis aute irure in reprehenderit voluptate velit esse cillum fugiat "
         "nulla pariatur excepteur sint occaecat cupidatat non proident").split()
JUNK_LINES = ["Click here to claim your free prize #{n} now!", "Best price guaranteed - order {n} today!", "This domain ({n}) may be for sale.",
              "Loading item {n} of 50...", "Share this page on social media (ref {n})", "Enter your email to continue - code {n}"]


def junk_page(rng, kind, i):
    """A page the quality filters must drop: (title, blocks, body HTML)."""
    topic = rng.choice(SPAM_TOPICS)
    brand = f"{rng.choice(['Mega', 'Super', 'Best', 'Top', 'Ultra', 'Prime'])}{rng.choice(['Deals', 'Shop', 'Store', 'Offers', 'Hub'])}{rng.randrange(10, 99)}"
    spam = lambda: rng.choice(topic) + rng.choice(SPAM_WORDS + [" at " + brand, " " + brand])  # the brand keeps two spam pages apart
    if kind == "junk_linkfarm":
        title = f"{topic[0].title()} Directory - Page {i + 1}"
        links = [f"{spam()} {rng.choice(['online', 'today', '2024', 'best', 'top 10', 'review', 'uk', 'usa'])}" for _ in range(rng.randint(40, 90))]
        items = "".join(f'<li><a href="https://{slugify(link)}-{rng.randrange(100)}.example/">{link}</a></li>' for link in links)
        return title, [("ul", links)], f"<h1>{title}</h1>\n<ul>{items}</ul>"
    if kind == "junk_keyword":
        title = " ".join(topic).title()
        words = " ".join(spam() for _ in range(rng.randint(60, 140)))
        return title, [("p", [words])], f"<h1>{title}</h1>\n<p>{words}</p>"
    if kind == "junk_repeated":
        line, n = rng.choice(JUNK_LINES).format(n=rng.randrange(1000, 9999)), rng.randint(30, 60)
        return line, [("ul", [line] * n)], "\n".join(f"<p>{line}</p>" for _ in range(n))
    paras = [("p", [" ".join(rng.choice(LOREM) for _ in range(rng.randint(6, 16))).capitalize() + "." for _ in range(rng.randint(3, 6))])
             for _ in range(rng.randint(3, 7))]
    return "Lorem Ipsum", paras, "<h1>Lorem Ipsum</h1>\n" + render_blocks(paras)


def junk_pages(rng, sites):
    """Spam on throwaway hosts, chrome-only pages on the real sites, and empty pages."""
    out = []
    for kind in ("junk_linkfarm", "junk_keyword", "junk_repeated", "junk_lorem", "junk_boilerplate", "empty_body"):
        for i in range(5 if kind == "empty_body" else 15):
            if kind == "junk_boilerplate":
                site = rng.choice(sites)
                title = rng.choice(["Home", "Archive", "Subscribe", "Newsletter", "Tag: River", "Search results"])
                out.append(dict(category=kind, lang="en", title=title, blocks=None, html=render_page(rng, site, title, None, [("/", site["name"])]).encode(),
                                url=f"https://{site['domain']}/{slugify(title)}/page/{i + 1}/"))
                continue
            title, blocks, body = (rng.choice(["Untitled", "Welcome", "Coming soon"]), None, "") if kind == "empty_body" else junk_page(rng, kind, i)
            host = f"{kind.split('_')[-1]}-{slugify(rng.choice(SPAM_TOPICS)[0])}-{i}.example"
            out.append(dict(category=kind, lang=None if kind in ("junk_lorem", "empty_body") else "en", title=title, blocks=blocks,
                            html=bare_page(title, body).encode(), url=f"https://{host}/{slugify(title)}.html", sentence=None))
    return out


# ----------------------------------------------------------------------------- near duplicates
SYNONYMS = {"old": "ancient", "small": "little", "busy": "lively", "quiet": "calm", "people": "residents", "famous": "celebrated", "often": "frequently",
            "visitors": "tourists", "about": "around", "many": "numerous", "built": "constructed", "town": "village", "river": "stream", "still": "even now",
            "known": "noted", "best": "finest", "first": "earliest", "most": "nearly all", "families": "households", "work": "labour", "today": "nowadays", "began": "started"}


def edit_once(rng, blocks, spare, big):
    """One edit of a near-duplicate: replace, insert or delete a sentence (big), or change one word."""
    i = rng.choice([i for i, (k, _) in enumerate(blocks) if k == "p"])
    sents = list(blocks[i][1])
    j = rng.randrange(len(sents))
    if big:
        op = rng.choice(["replace", "replace", "delete", "insert"])
        if op == "delete" and len(sents) > 1 or not spare:
            if len(sents) > 1:
                del sents[j]
            else:
                sents[j] = sents[j].split(",")[0].rstrip(".") + "."
        elif op == "insert":
            sents.insert(j, spare.pop())
        else:
            sents[j] = spare.pop()
    else:
        words = sents[j].split(" ")
        cands = [k for k, wd in enumerate(words) if wd.strip(",.:;\"").lower() in SYNONYMS or wd.strip(",.").isdigit()]
        if not cands:
            return
        k = rng.choice(cands)
        core = words[k].strip(",.:;\"")
        new = str(int(core) + rng.randint(1, 9)) if core.isdigit() else SYNONYMS[core.lower()]
        words[k] = words[k].replace(core, new[0].upper() + new[1:] if core[0].isupper() else new)
        sents[j] = " ".join(words)
    blocks[i] = ("p", sents)


def near_duplicate(rng, art, target):
    """Edit a copy of the article until its 5-gram Jaccard with the original is within tolerance."""
    orig = body_text(art["blocks"])
    for _ in range(200):
        blocks, spare = [(k, list(x) if k == "p" else x) for k, x in art["blocks"]], list(art["spare"])
        rng.shuffle(spare)
        while True:
            j = jaccard(orig, body_text(blocks))
            if abs(j - target) <= NEAR_DUP_TOL - 0.005:
                return blocks, j
            if j < target:  # overshot: start again from the original
                break
            edit_once(rng, blocks, spare, big=j - target > 0.06)
    raise RuntimeError(f"could not reach Jaccard {target}")


# ----------------------------------------------------------------------------- non-HTML payloads
def png_bytes(w, h, tint):
    """A real PNG: an RGB gradient, zlib-compressed scanlines, CRC-checked chunks."""
    raw = b"".join(b"\x00" + bytes(v for x in range(w) for v in (x * 255 // w, y * 255 // h, tint)) for y in range(h))
    chunk = lambda t, d: struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d))
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)) + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")


def pdf_bytes(text):
    """A minimal one-page PDF 1.4 with a correct cross-reference table."""
    content = f"BT /F1 14 Tf 72 720 Td ({text}) Tj ET"
    objs = ["<< /Type /Catalog /Pages 2 0 R >>", "<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
            "<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R /Resources << /Font << /F1 5 0 R >> >> >>",
            f"<< /Length {len(content)} >>\nstream\n{content}\nendstream", "<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>"]
    out, offsets = b"%PDF-1.4\n", []
    for i, o in enumerate(objs):
        offsets.append(len(out))
        out += f"{i + 1} 0 obj\n{o}\nendobj\n".encode()
    xref = "".join(f"{o:010d} 00000 n \n" for o in offsets)
    return out + f"xref\n0 {len(objs) + 1}\n0000000000 65535 f \n{xref}trailer\n<< /Size {len(objs) + 1} /Root 1 0 R >>\nstartxref\n{len(out)}\n%%EOF\n".encode()


def chunked(body, size=1500):
    return b"".join(b"%x\r\n%s\r\n" % (len(body[i:i + size]), body[i:i + size]) for i in range(0, len(body), size)) + b"0\r\n\r\n"


LEGACY_SENTENCE = "At the café on Müllerstraße the “crème brûlée” costs 4 € — and every spoonful is worth it."
ERROR_PAGE = "<!DOCTYPE html>\n<html>\n<head><title>{code} {reason}</title></head>\n<body>\n<h1>{reason}</h1>\n<p>{text}</p>\n<hr><address>{server}</address>\n</body>\n</html>\n"


# ----------------------------------------------------------------------------- pages
def pick_subject(rng, w, kind):
    t = rng.choice(w["towns"])
    if kind == "person":
        return rng.choice(w["people"])
    if kind == "animal":
        return t, t["animal"] if rng.random() < 0.5 else rng.choice(ANIMALS)
    if kind == "event":
        return t, rng.choice(t["events"])
    if kind == "river":
        return rng.choice([r for r in w["rivers"] if len(r["towns"]) >= 2])
    if kind == "compare":
        return t, t["nb"]
    if kind == "craft":
        return next(c for c in CRAFTS if c[0] == t["craft"]), t
    return t  # town, food


def text_page(rng, category, site, art, i):
    """Give generated content a site, a publication date and a URL."""
    d = START - timedelta(days=rng.randrange(1, 900))
    nav = (site["nav"] or "news").split("|")
    path = site["url"].format(sec=slugify(nav[i % len(nav)]), y=d.year, m=d.month, d=d.day, slug=slugify(art["title"])[:60] or "page", id=1000 + i)
    return dict(lang="en") | art | dict(category=category, site=site, date=d, url=f"https://{site['domain']}{path}")


def english_pages(rng, w):
    """Articles, exact duplicates and near-duplicate pairs; also picks the page to revisit."""
    kinds = [k for k, n in ARTICLE_KINDS.items() for _ in range(n)]
    rng.shuffle(kinds)
    articles = []
    for i, kind in enumerate(kinds):
        art = build_article(rng, w, kind, pick_subject(rng, w, kind))
        articles.append(text_page(rng, "article", rng.choice([s for s in SITES if kind in s["kinds"].split()]), art, i))
    bases = rng.sample(articles, 41)
    taken = {id(a) for a in bases}
    rest = [a for a in articles if id(a) not in taken and len(body_text(a["blocks"]).split()) >= 280]
    bases += rng.sample(rest, 60)  # near-duplicates of long articles: one word edit moves Jaccard by < 0.02
    copies, near = [], []
    for k, base in enumerate(bases[:40]):  # the same bytes under a tracking query, an AMP path or a mirror host
        url = base["url"]
        url = [url + ("&" if "?" in url else "?") + "utm_source=newsletter&utm_medium=email", re.sub(r"^(https://[^/]+)/", r"\1/amp/", url),
               url.replace(".example/", "-mirror.example/", 1)][k % 3]
        copies.append(dict(base, category="exact_dup", url=url, dup_of=base["url"], after=base["url"], html_of=base))
    for k, base in enumerate(bases[41:]):
        base["near_base"], target = True, NEAR_DUP_TARGETS[k // 10]
        blocks, j = near_duplicate(rng, base, target)
        site = base["site"] if k % 2 else rng.choice([s for s in SITES if base["kind"] in s["kinds"].split()])  # same site or syndicated
        page = text_page(rng, "near_dup", site, dict(base, blocks=blocks), 5000 + k) | dict(after=base["url"])
        near.append(dict(url_a=base["url"], url_b=page["url"], target_jaccard=target, jaccard=j))
        copies.append(page)
    return articles, copies, near, bases[40]


def other_pages(rng, w):
    """Math practice, other languages, and English articles served in awkward ways."""
    pages = [text_page(rng, "math", MATH_SITE, math_page(rng, w, i), 7000 + i) for i in range(150)]
    for code, n in (("de", 20), ("fr", 20), ("es", 20), ("pl", 20), ("zh", 2)):
        pages += [text_page(rng, "lang", LANG_SITES[code], lang_page(rng, code), 8000 + 20 * list(LANG_SITES).index(code) + i) for i in range(n)]
    for i, cat in enumerate(["gzip_encoded", "chunked", "no_content_type", "truncated", "legacy_charset"]):
        art = build_article(rng, w, "town", rng.choice(w["towns"]))
        if cat == "legacy_charset":
            art["blocks"].insert(1, ("p", [LEGACY_SENTENCE]))
            art["sentence"] = LEGACY_SENTENCE
        elif cat == "truncated":  # the record keeps only the first part: plant a sentence from it
            art["sentence"] = art["blocks"][0][1][0]
        pages.append(text_page(rng, cat, rng.choice([s for s in SITES if "town" in s["kinds"]]), art, 6000 + i))
    return pages


def choose_sentences(pages):
    """A distinctive full sentence per text page (unique in the crawl if possible), for extractor tests."""
    sents = lambda p: [s for k, x in p["blocks"] if k == "p" for para in x for s in re.split(r"(?<=。)(?!$)", para)]
    count = {}
    for p in pages:
        if p["category"] != "exact_dup":
            for s in set(sents(p)):
                count[s] = count.get(s, 0) + 1
    for p in pages:
        if "sentence" not in p and p["category"] != "exact_dup":
            p["sentence"] = max(sents(p), key=lambda s: (count[s] == 1, len(s), s))
    for p in pages:
        if p["category"] == "exact_dup":
            p["sentence"] = p["html_of"]["sentence"]


def render_all(rng, pages):
    """HTML for every text page; the sidebar links to other pages of the same site."""
    by_site = {}
    for p in pages:
        if p["category"] != "exact_dup":
            by_site.setdefault(p["site"]["domain"], []).append(p)
    for p in pages:
        if p["category"] == "exact_dup":
            continue
        peers = [q for q in by_site[p["site"]["domain"]] if q is not p]
        related = [("/" + q["url"].split("/", 3)[3], q["title"]) for q in rng.sample(peers, min(3, len(peers)))]
        if p["lang"] == "en":
            byline = say(rng, "[By {a} | {d}|Posted on {d} by {a}|{a}, {d}]", dict(a=f"{rng.choice(FEMALE + MALE)} {rng.choice(SURNAMES)}",
                                                                                 d=f"{p['date'].day} {MONTHS[p['date'].month - 1]} {p['date'].year}"))
        else:
            byline = f"{LANGS[p['lang']]['chrome']['by']} {p['date']:%Y-%m-%d}"
        legacy = p["category"] == "legacy_charset"
        meta = '<meta http-equiv="Content-Type" content="text/html; charset=windows-1252">' if legacy else '<meta charset="utf-8">'
        page = render_page(rng, p["site"], p["title"], render_blocks(p["blocks"]), related, p["lang"], byline, rng.random() < 0.7, meta)
        p["html"] = page.encode("cp1252" if legacy else "utf-8")
    for p in pages:
        if p["category"] == "exact_dup":
            p["html"] = p.pop("html_of")["html"]


# ----------------------------------------------------------------------------- HTTP
SERVERS = ["nginx", "nginx/1.24.0", "Apache/2.4.58 (Debian)", "cloudflare", "LiteSpeed"]
REASONS = {200: "OK", 301: "Moved Permanently", 302: "Found", 404: "Not Found"}
CLD2 = {"en": ("eng", "ENGLISH"), "de": ("deu", "GERMAN"), "fr": ("fra", "FRENCH"), "es": ("spa", "SPANISH"), "pl": ("pol", "POLISH"), "zh": ("zho", "Chinese")}


def page_capture(p):
    """A text page as an HTTP 200 response; its category decides how the body goes over the wire."""
    cat, host = p["category"], p["url"].split("/")[2]
    ctype = {"no_content_type": None, "legacy_charset": "text/html"}.get(cat, ["text/html; charset=utf-8", "text/html; charset=UTF-8"][fixed(host, 0, 1)])
    text = body_text(p["blocks"]) if p.get("blocks") else ""
    c = dict(url=p["url"], status=200, body=p["html"], ctype=ctype, ident="text/html", category=cat, lang=p.get("lang"), title=p.get("title"),
             sentence=p.get("sentence"), dup_of=p.get("dup_of"), after=p.get("after"), text=text, charset="windows-1252" if cat == "legacy_charset" else "UTF-8",
             # planted.json keeps the full text where a test needs it; other articles keep only their sentence
             body_text=text if cat not in ("article", "exact_dup") or p.get("near_base") else None,
             encoding="gzip" if cat == "gzip_encoded" else None, chunked=cat == "chunked", truncate=len(p["html"]) * 3 // 5 if cat == "truncated" else None)
    assert cat != "truncated" or p["sentence"].encode() in p["html"][:c["truncate"]]
    return c


def other_captures(rng, articles):
    """Responses that are not HTML documents: files, errors and redirects."""
    out = [dict(url=f"https://{s['domain']}/robots.txt", ctype="text/plain",
                body=f"User-agent: *\nDisallow: /search\nDisallow: /subscribe\n\nSitemap: https://{s['domain']}/sitemap.xml\n".encode()) for s in SITES[:4]]
    out += [dict(url=f"https://{s['domain']}/static/img/logo-{s['p']}.png", ctype="image/png", body=png_bytes(24 + 8 * i, 16, 40 * i)) for i, s in enumerate(SITES[4:7])]
    out += [dict(url=f"https://{s['domain']}/files/annual-report-{2021 + i}.pdf", ctype="application/pdf", body=pdf_bytes(f"{s['name']} - Annual Report {2021 + i}"))
            for i, s in enumerate(SITES[7:9])]
    out += [dict(url=f"https://{s['domain']}/api/v1/articles?page={i + 1}", ctype="application/json",
                 body=json.dumps(dict(page=i + 1, items=[dict(title=a["title"], url=a["url"]) for a in articles if a["site"]["domain"] == s["domain"]][:5]), sort_keys=True).encode())
            for i, s in enumerate(SITES[:3])]
    out += [dict(url=f"https://{s['domain']}/static/{s['p']}.css", ctype="text/css",
                 body=f".{s['p']}-header {{ background: #223; color: #fff; }}\n.{s['p']}-sidebar {{ float: right; width: 30%; }}\n.cookie-banner {{ position: fixed; bottom: 0; }}\n".encode())
            for s in SITES[3:6]]
    out = [c | dict(status=200, category="non_html", ident=c["ctype"]) for c in out]
    for i, s in enumerate(SITES[:5]):
        body = ERROR_PAGE.format(code=404, reason="Not Found", text="The requested URL was not found on this server.", server=SERVERS[fixed(s["domain"], 0, 4)])
        out.append(dict(url=f"https://{s['domain']}/news/2019/0{i + 1}/removed-story-{i}/", status=404, body=body.encode(), ctype="text/html", ident="text/html", category="not_found"))
    for i, a in enumerate(rng.sample(articles, 6)):  # http -> https (301) and old ?p= links (302)
        code, old = (301, a["url"].replace("https://", "http://")) if i % 2 == 0 else (302, f"https://{a['url'].split('/')[2]}/?p={100 + i}")
        body = ERROR_PAGE.format(code=code, reason=REASONS[code], text=f'The document has moved <a href="{a["url"]}">here</a>.', server="nginx")
        out.append(dict(url=old, status=code, body=body.encode(), ctype="text/html", ident="text/html", category="redirect", headers=[("Location", a["url"])]))
    return out


def http_response(c, when):
    """Status line, headers and the body as it went over the wire (gzip, chunked, truncated)."""
    day = "Mon Tue Wed Thu Fri Sat Sun".split()[when.weekday()]
    headers = [("Date", f"{day}, {when.day:02d} {MONTHS[when.month - 1][:3]} {when.year} {when:%H:%M:%S} GMT"), ("Server", SERVERS[fixed(c["url"].split("/")[2], 0, 4)])]
    headers += [("Content-Type", c["ctype"])] if c["ctype"] else []
    body = gzip_member(c["body"]) if c.get("encoding") else c["body"]
    headers += [("Content-Encoding", c["encoding"])] if c.get("encoding") else []
    if c.get("chunked"):
        headers.append(("Transfer-Encoding", "chunked"))
        body = chunked(body)
    else:
        headers.append(("Content-Length", str(len(body))))
    headers += c.get("headers", []) + [("Cache-Control", "max-age=600"), ("Connection", "close")]
    head = f"HTTP/1.1 {c['status']} {REASONS[c['status']]}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers) + "\r\n"
    return head.encode() + (b"" if c.get("revisit") else body[:c.get("truncate")])


def http_request(url):
    host, path = url.split("/", 3)[2], "/" + (url.split("/", 3) + [""])[3]
    return (f"GET {path} HTTP/1.1\r\nUser-Agent: CCBot/2.0 (https://commoncrawl.org/faq/)\r\nAccept: text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8\r\n"
            f"Accept-Language: en-US,en;q=0.5\r\nAccept-Encoding: br,gzip\r\nHost: {host}\r\nConnection: Keep-Alive\r\n\r\n").encode()


def metadata_fields(rng, c):
    """Like Common Crawl's metadata record: fetch time, detected charset, CLD2's languages."""
    lines = [f"fetchTimeMs: {rng.randint(40, 1800)}"] + ([f"charset-detected: {c['charset']}"] if c.get("charset") else [])
    if c.get("text") and c.get("lang") in CLD2:
        n = len(c["text"].encode())
        lang = {"code": c["lang"], "code-iso-639-3": CLD2[c["lang"]][0], "text-covered": 0.99, "score": float(900 + n % 300), "name": CLD2[c["lang"]][1]}
        lines.append("languages-cld2: " + json.dumps({"reliable": True, "text-bytes": n, "languages": [lang]}, separators=(",", ":")))
    return ("\r\n".join(lines) + "\r\n").encode()


# ----------------------------------------------------------------------------- WARC
def record_id(seed, *parts):
    return f"<urn:uuid:{uuid.uuid5(uuid.NAMESPACE_URL, ':'.join(map(str, ('llmctl-example', seed, *parts))))}>"


def warc_record(rtype, url, block, headers):
    """One record, gzipped as its own member. warcio writes the HTTP records (it parses the HTTP
    head and computes block and payload digests); warcinfo, request and metadata records carry
    no digests in Common Crawl and are written directly."""
    if rtype in ("response", "revisit"):
        rec = WARCWriter(None).create_warc_record(url, rtype, payload=io.BytesIO(block), length=len(block), warc_headers_dict=headers)
        raw = io.BytesIO()
        WARCWriter(raw, gzip=False).write_record(rec)
        return rec.rec_headers.get_header("WARC-Payload-Digest"), gzip_member(raw.getvalue())
    fields = headers | ({"WARC-Target-URI": url} if url else {}) | {"Content-Length": len(block)}
    return None, gzip_member(("WARC/1.0\r\n" + "".join(f"{k}: {v}\r\n" for k, v in fields.items()) + "\r\n").encode() + block + b"\r\n\r\n")


def write_warcs(rng, out_dir, captures, seed):
    """Per file a warcinfo record, then request, response (or revisit) and metadata per capture.
    Returns one planted entry per record, with its byte offset."""
    entries, when, half = [], START, (len(captures) + 1) // 2
    for name, part in zip(FILES, (captures[:half], captures[half:])):
        buf = bytearray()

        def add(rtype, url, block, headers, c=None):
            digest, data = warc_record(rtype, url, block, headers)
            e = dict(file=name, offset=len(buf), length=len(data), warc_type=rtype, record_id=headers["WARC-Record-ID"], url=url or None, category=rtype)
            c = c or {}  # a response or revisit carries what was planted in it; the other records only nulls
            e |= dict(http_status=c.get("status"), content_type=c.get("ctype"), category=c.get("category", rtype))
            e |= {k: c.get(k) for k in ("lang", "title", "sentence", "body_text", "dup_of")}
            entries.append(e)
            buf.extend(data)
            return digest

        info_id = record_id(seed, name, "warcinfo")
        info = (f"isPartOf: CC-EXAMPLE-2024-10\r\npublisher: llmctl (synthetic example crawl)\r\ndescription: examples/make_crawl.py, seed {seed}\r\n"
                "operator: llmctl\r\nsoftware: llmctl-make-crawl/1.0 (warcio)\r\nformat: WARC File Format 1.0\r\n"
                "conformsTo: https://iipc.github.io/warc-specifications/specifications/warc-format/warc-1.0/\r\n")
        add("warcinfo", "", info.encode(), {"WARC-Type": "warcinfo", "WARC-Date": f"{when:%Y-%m-%dT%H:%M:%SZ}", "WARC-Record-ID": info_id,
                                            "WARC-Filename": name, "Content-Type": "application/warc-fields"})
        for c in part:
            when += timedelta(seconds=rng.randint(1, 40))
            c["warc_date"] = f"{when:%Y-%m-%dT%H:%M:%SZ}"
            host, n = c["url"].split("/")[2], len(entries)
            ip = f"{['203.0.113', '198.51.100'][fixed(host, 0, 1)]}.{fixed(host, 1, 254)}"  # documentation address ranges
            req_id, resp_id = record_id(seed, n, "request", c["url"]), record_id(seed, n, "response", c["url"])
            base = {"WARC-Date": c["warc_date"], "WARC-Warcinfo-ID": info_id}
            add("request", c["url"], http_request(c["url"]), {"WARC-Type": "request", "WARC-Record-ID": req_id, **base,
                                                               "Content-Type": "application/http; msgtype=request", "WARC-IP-Address": ip})
            rtype = "revisit" if c.get("revisit") else "response"
            h = {"WARC-Type": rtype, "WARC-Record-ID": resp_id, **base, "WARC-Concurrent-To": req_id, "WARC-IP-Address": ip}
            if rtype == "revisit":  # like CC: HTTP headers only, pointing at the earlier capture with the same payload
                h |= {"WARC-Profile": "http://netpreserve.org/warc/1.0/revisit/identical-payload-digest", "WARC-Refers-To-Target-URI": c["url"],
                      "WARC-Refers-To-Date": c["of"]["warc_date"], "WARC-Payload-Digest": c["of"]["digest"]}
            else:
                h |= {"WARC-Identified-Payload-Type": c["ident"]} | ({"WARC-Truncated": "length"} if c.get("truncate") else {})
            c["digest"] = add(rtype, c["url"], http_response(c, when), h, c)
            add("metadata", c["url"], metadata_fields(rng, c), {"WARC-Type": "metadata", "WARC-Record-ID": record_id(seed, n, "metadata", c["url"]), **base,
                                                                "Content-Type": "application/warc-fields", "WARC-Concurrent-To": resp_id})
        (out_dir / name).write_bytes(bytes(buf))
    return entries


def crawl_order(rng, captures):
    """Shuffle, then make sure a duplicate comes after the page it copies."""
    rng.shuffle(captures)
    pos = {c["url"]: i for i, c in enumerate(captures) if c["category"] == "article"}
    for i in range(len(captures)):
        ref = captures[i].get("after")
        if ref and pos[ref] > i:  # every original has one copy at most, so a swap fixes the pair
            captures[i], captures[pos[ref]] = captures[pos[ref]], captures[i]
            pos[ref] = i
    return captures


# ----------------------------------------------------------------------------- main
def generate(out_dir: Path, seed: int = 1234) -> dict:
    """Write the two WARC files and planted.json into out_dir; return the planted dict."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    w = build_world(rng)
    articles, copies, near, revisit_of = english_pages(rng, w)
    pages = articles + copies + other_pages(rng, w)
    choose_sentences(pages)
    render_all(rng, pages)
    pages += junk_pages(rng, SITES)
    captures = crawl_order(rng, [page_capture(p) for p in pages] + other_captures(rng, articles))
    original = next(c for c in captures if c["url"] == revisit_of["url"])  # re-fetched at the end of the crawl, unchanged
    captures.append(dict(original, revisit=True, category="revisit", of=original, sentence=None, body_text=None, text=None))
    assert len({c["url"] for c in captures}) == len(captures) - 1, "URLs are unique, but for the revisit"
    entries = write_warcs(rng, out_dir, captures, seed)
    counts = {}
    for e in entries:
        counts[e["category"]] = counts.get(e["category"], 0) + 1
    planted = dict(seed=seed, files={f: hashlib.sha256((out_dir / f).read_bytes()).hexdigest() for f in FILES}, counts=counts, captures=entries,
                   near_duplicates=near, near_duplicate_tolerance=NEAR_DUP_TOL, legacy_charset_sentence=LEGACY_SENTENCE,
                   problems=[dict(url=p["url"], question=q, solution="\n".join(sol), answer=a) for p in pages if p["category"] == "math" for q, sol, a in p["problems"]])
    (out_dir / "planted.json").write_text(json.dumps(planted, sort_keys=True, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return planted


def main():
    ap = argparse.ArgumentParser(description="Write the example crawl (two WARC files and planted.json).")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "crawl", help="output directory (default: examples/crawl)")
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args()
    planted = generate(args.out, args.seed)
    sizes = ", ".join(f"{f} {(args.out / f).stat().st_size / 1e6:.2f} MB" for f in FILES)
    print(f"wrote {sizes} and planted.json ({len(planted['captures'])} records) to {args.out}")


if __name__ == "__main__":
    main()
