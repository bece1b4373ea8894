"""Twenty Questions: find the secret object by yes/no questions.

The built-in table below (written for turngym) gives each object the attributes that are true
for it; every other attribute is false. Categories follow LMRL-Gym's object list; the official
list (``turngym data download lmrl``) can be used with a model answerer (``objects="lmrl"``),
since the rule answerer only knows the objects of this table.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from turngym.envs.games.qgame import Entity, Question, QuestionGameEnv

# (key, canonical question, keyword pattern over the normalised question); the first pattern that
# matches wins, so specific ones come first.
ATTRIBUTES = [
    ("legs4", "Does it have four legs?", r"\bfour legs\b|\b4 legs\b|\blegs\b"),
    ("mammal", "Is it a mammal?", r"\bmammals?\b"),
    ("pet", "Is it commonly kept as a pet?", r"\bpets?\b"),
    ("farm", "Is it a farm animal?", r"\bfarms?\b"),
    ("bark", "Does it bark?", r"\bbarks?\b"),
    ("meat", "Does it eat meat?", r"\bmeat\b|\bcarnivor"),
    ("wild", "Does it live in the wild?", r"\bwild\b"),
    ("animal", "Is it an animal?", r"\banimals?\b|\bcreatures?\b"),
    ("plant", "Is it a plant?", r"\bplants?\b"),
    ("alive", "Is it a living thing?", r"\balive\b|\bliving\b"),
    ("fruit", "Is it a fruit?", r"\bfruits?\b"),
    ("vegetable", "Is it a vegetable?", r"\bvegetables?\b|\bveggies?\b"),
    ("sweet", "Does it taste sweet?", r"\bsweet\b"),
    ("tree", "Does it grow on trees?", r"\btrees?\b"),
    ("edible", "Can you eat it?", r"\beat\b|\bedible\b|\bfood\b"),
    ("drink", "Do you drink from it?", r"\bdrink"),
    ("cook", "Is it used for cooking?", r"\bcook"),
    ("cold", "Does it keep things cold?", r"\bcold\b|\bcool\b"),
    ("heat", "Does it heat things up?", r"\bheat|\bhot\b|\bwarm"),
    ("kitchen", "Is it found in a kitchen?", r"\bkitchen\b"),
    ("screen", "Does it have a screen?", r"\bscreens?\b|\bdisplay\b"),
    ("type", "Can you type on it?", r"\btyp(e|ing)\b|\bkeyboard\b"),
    ("photos", "Can it take photos?", r"\bphotos?\b|\bpictures?\b|\bcamera\b"),
    ("electric", "Does it use electricity?", r"\belectric|\bbatter(y|ies)\b|\bplug|\bpower"),
    ("rails", "Does it run on rails?", r"\brails?\b|\btracks?\b"),
    ("wings", "Does it have wings?", r"\bwings?\b"),
    ("flies", "Can it fly?", r"\bfl(y|ies|ying)\b"),
    ("engine", "Does it have an engine?", r"\bengines?\b|\bmotor"),
    ("wheels", "Does it have wheels?", r"\bwheels?\b"),
    ("ride", "Do people ride on it?", r"\bride\b|\briding\b"),
    ("vehicle", "Is it a vehicle?", r"\bvehicles?\b|\btransport"),
    ("salt", "Is it salty?", r"\bsalt"),
    ("water", "Is it found in or used on water?", r"\bwater\b|\bswim|\bsea\b|\bocean\b"),
    ("feet", "Is it worn on the feet?", r"\bfeet\b|\bfoot\b"),
    ("head", "Is it worn on the head?", r"\bhead\b"),
    ("wear", "Do you wear it?", r"\bwear|\bclothing\b|\bclothes\b"),
    ("sleep", "Do you sleep on it?", r"\bsleep"),
    ("soft", "Is it soft?", r"\bsoft\b"),
    ("sit", "Can you sit on it?", r"\bsit\b"),
    ("furniture", "Is it a piece of furniture?", r"\bfurniture\b"),
    ("bow", "Is it played with a bow?", r"\bbow\b"),
    ("keys", "Does it have keys?", r"\bkeys\b"),
    ("blow", "Do you blow into it?", r"\bblow\b|\bwind\b"),
    ("strings", "Does it have strings?", r"\bstrings?\b"),
    ("instrument", "Is it a musical instrument?", r"\binstruments?\b|\bmusic"),
    ("kick", "Do you kick it?", r"\bkick"),
    ("ball", "Is it a ball?", r"\bballs?\b"),
    ("hit", "Do you hit things with it?", r"\bhit\b|\bstrike\b|\bbang\b"),
    ("sport", "Is it used in sports?", r"\bsports?\b|\bgames?\b|\bathlet"),
    ("toy", "Is it a toy?", r"\btoys?\b|\bplay with\b"),
    ("write", "Do you write with it?", r"\bwrit(e|ing)\b"),
    ("read", "Do you read it?", r"\bread\b"),
    ("time", "Does it tell the time?", r"\btime\b"),
    ("sharp", "Is it sharp?", r"\bsharp\b|\bcut\b|\bblades?\b"),
    ("tool", "Is it a tool?", r"\btools?\b"),
    ("metal", "Is it made mostly of metal?", r"\bmetal\b|\bsteel\b|\biron\b"),
    ("wood", "Is it made mostly of wood?", r"\bwood"),
    ("round", "Is it round?", r"\bround\b|\bspher|\bcircular\b"),
    ("red", "Is it usually red?", r"\bred\b"),
    ("green", "Is it usually green?", r"\bgreen\b"),
    ("yellow", "Is it usually yellow?", r"\byellow\b"),
    ("big", "Is it bigger than a person?", r"\bbig|\blarge|\bhuge\b|\btall\b"),
    ("handheld", "Can you hold it in one hand?", r"\bhold\b|\bhand\b|\bcarry\b|\bsmall\b|\bpocket\b"),
    ("outdoors", "Is it usually found outdoors?", r"\boutdoors?\b|\boutside\b"),
]

# category: [(name; aliases, "true attributes")]
OBJECTS = {
    "Animals": [
        ("Cat", "alive animal mammal pet meat legs4"),
        ("Dog", "alive animal mammal pet meat legs4 bark"),
        ("Horse", "alive animal mammal farm legs4 big outdoors ride"),
        ("Cow", "alive animal mammal farm legs4 big outdoors"),
        ("Sheep", "alive animal mammal farm legs4 outdoors"),
        ("Rabbit", "alive animal mammal pet wild legs4 outdoors"),
        ("Lion", "alive animal mammal wild meat legs4 big outdoors"),
        ("Elephant", "alive animal mammal wild legs4 big outdoors"),
        ("Eagle", "alive animal wild meat flies wings outdoors"),
        ("Shark", "alive animal wild meat water big"),
        ("Goldfish", "alive animal pet water handheld"),
    ],
    "Fruits": [
        ("Apple", "edible fruit sweet tree red handheld"),
        ("Banana", "edible fruit sweet tree yellow handheld"),
        ("Strawberry", "edible fruit sweet red handheld"),
        ("Orange", "edible fruit sweet tree handheld round"),
        ("Lemon", "edible fruit tree yellow handheld"),
        ("Watermelon", "edible fruit sweet green"),
        ("Grape;Grapes", "edible fruit sweet green handheld"),
    ],
    "Vegetables": [
        ("Carrot", "edible vegetable handheld"),
        ("Broccoli", "edible vegetable green handheld"),
        ("Tomato", "edible vegetable red handheld round"),
        ("Corn", "edible vegetable yellow"),
    ],
    "Vehicles": [
        ("Car", "vehicle wheels engine metal big outdoors"),
        ("Bicycle;Bike", "vehicle wheels ride metal outdoors"),
        ("Motorcycle;Motorbike", "vehicle wheels engine ride metal outdoors"),
        ("Airplane;Plane;Aeroplane", "vehicle flies wings engine metal big"),
        ("Helicopter", "vehicle flies engine metal big"),
        ("Train", "vehicle wheels engine rails metal big"),
        ("Boat", "vehicle water"),
        ("Ship", "vehicle water engine metal big"),
    ],
    "Clothes": [
        ("Shirt", "wear soft"),
        ("Shoes;Shoe;Pair of shoes", "wear feet"),
        ("Hat", "wear head"),
        ("Helmet", "wear head sport"),
    ],
    "Electronics": [
        ("Computer", "electric screen type"),
        ("Smartphone;Phone;Cell phone;Mobile phone", "electric screen handheld photos"),
        ("Television;TV", "electric screen"),
        ("Refrigerator;Fridge", "electric kitchen cold metal"),
        ("Microwave;Microwave oven", "electric kitchen heat cook"),
        ("Blender", "electric kitchen sharp"),
        ("Headphones;Headphone;Pair of headphones", "electric wear head"),
    ],
    "Musical Instruments": [
        ("Piano", "instrument wood strings keys"),
        ("Guitar", "instrument wood strings"),
        ("Violin", "instrument wood strings bow"),
        ("Drum;Drums", "instrument hit round"),
        ("Trumpet", "instrument metal blow"),
    ],
    "Furniture": [
        ("Chair", "furniture sit wood legs4"),
        ("Table", "furniture wood legs4"),
        ("Bed", "furniture sleep sit soft big"),
        ("Couch;Sofa", "furniture sit soft"),
        ("Pillow", "soft sleep"),
    ],
    "Kitchen Tools": [
        ("Knife", "kitchen sharp metal handheld"),
        ("Spoon", "kitchen metal handheld"),
        ("Plate", "kitchen round"),
        ("Cup;Mug", "kitchen drink handheld"),
        ("Pan;Frying pan;Saucepan", "kitchen metal cook"),
    ],
    "Tools": [
        ("Hammer", "tool metal handheld hit"),
        ("Screwdriver", "tool metal handheld"),
        ("Saw", "tool metal sharp"),
        ("Drill", "tool electric metal handheld"),
        ("Shovel", "tool outdoors"),
        ("Lawn mower;Lawnmower", "tool engine wheels outdoors metal"),
    ],
    "Sports": [
        ("Basketball", "sport ball round"),
        ("Soccer ball;Football", "sport ball round kick"),
        ("Tennis ball", "sport ball round handheld yellow"),
        ("Golf ball", "sport ball round handheld"),
        ("Baseball bat;Bat", "sport wood hit"),
        ("Tennis racket;Racket", "sport strings"),
    ],
    "Nature": [
        ("Tree", "alive plant outdoors big wood green"),
        ("Cactus", "alive plant outdoors green sharp"),
        ("Rock;Stone", "outdoors"),
        ("Mountain", "outdoors big"),
        ("River", "outdoors water big"),
        ("Ocean;Sea", "outdoors water big salt"),
    ],
    "Office Supplies": [
        ("Pen", "write handheld"),
        ("Pencil", "write wood handheld"),
        ("Book", "read handheld"),
        ("Key", "metal handheld"),
        ("Scissors;Pair of scissors", "sharp metal handheld"),
        ("Clock", "time"),
        ("Watch;Wristwatch", "time wear handheld"),
    ],
    "Toys": [
        ("Kite", "toy flies outdoors"),
        ("Doll", "toy handheld"),
        ("Lego;Lego set", "toy"),
    ],
}


def builtin_objects() -> list[Entity]:
    out = []
    for category, items in OBJECTS.items():
        for names, attrs in items:
            name, *aliases = names.split(";")
            out.append(Entity(name, tuple(aliases), {"category": category, "true": frozenset(attrs.split())}))
    return out


def lmrl_objects(data_dir: str | None = None) -> list[Entity]:
    """LMRL-Gym's object list (``twenty_questions_objects.json``: category -> ["Name;Alias", ...])."""
    from turngym.data import dataset_path

    data = json.loads((Path(dataset_path("lmrl", data_dir)) / "twenty_questions_objects.json").read_text())
    out = []
    for category, items in data.items():
        for names in items:
            name, *aliases = [n.strip() for n in names.split(";")]
            out.append(Entity(name, tuple(aliases), {"category": category, "true": frozenset()}))
    return out


def _yes_no(key: str):
    return lambda e: "Yes." if key in e.attrs["true"] else "No."


class TwentyQuestionsEnv(QuestionGameEnv):
    """Twenty Questions: guess the secret object by asking yes/no questions."""

    prefix = "20q"
    subject = "object"

    def __init__(self, split: str = "train", objects: str = "builtin", data_dir: str | None = None, **kw: Any) -> None:
        """Args:
            objects: ``builtin`` (the attribute table) or ``lmrl`` (official list; needs a model answerer).
            data_dir: Local data folder for ``objects="lmrl"``.
            **kw: See ``QuestionGameEnv`` (``answerer``, ``max_questions``, ``step_penalty``) and ``TextEnv``.
        """
        self._objects, self._data_dir = objects, data_dir
        if objects == "lmrl" and kw.get("answerer", "rules") == "rules":
            raise ValueError("objects='lmrl' needs a model answerer: the rule answerer only knows the built-in table")
        super().__init__(split=split, **kw)

    def build_entities(self) -> list[Entity]:
        if self._objects == "builtin":
            return builtin_objects()
        if self._objects == "lmrl":
            return lmrl_objects(self._data_dir)
        raise ValueError(f"objects must be 'builtin' or 'lmrl', got {self._objects!r}")

    def build_bank(self) -> list[Question]:
        return [Question(k, text, pattern, _yes_no(k)) for k, text, pattern in ATTRIBUTES]

    def intro(self) -> str:
        return ("Let's play twenty questions. I am thinking of an object; find it by asking yes/no questions, "
                "one per turn. When you think you know it, ask \"Is it a ...?\" naming the object.")

    def guess_text(self, e: Entity) -> str:
        return f"Is it {'an' if e.name[0].lower() in 'aeiou' else 'a'} {e.name.lower()}?"
