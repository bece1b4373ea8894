"""The domains of the generated SQL suite: what each database is about, table by table.

Every domain has the same shape, three tables in a chain, so that one set of question kinds
(``questions.py``) fits them all:

- a *parent* table (``authors``): ``id``, ``name``, a category column and a number column;
- an *item* table (``books``): ``id``, a name (or title), the parent's id, a category, a whole
  number, a price-like real number and a whole number that is sometimes NULL (not recorded);
- an *event* table (``loans``): ``id``, the item's id, a year, a quantity and a status.

Training and held-out databases come from different domains: ``TEST_DOMAINS`` use table names,
column names (``id`` and ``name`` aside), category values and name syllables that no training
domain uses, so a held-out database shares neither its schema nor its contents with training.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Cat:
    """A text column whose values come from ``values``; ``label`` is how a question names it."""

    col: str
    label: str
    values: tuple[str, ...]


@dataclass(frozen=True)
class Num:
    """A number column drawn from ``[low, high]``; ``label`` is how a question names it."""

    col: str
    label: str
    low: float
    high: float


@dataclass(frozen=True)
class Domain:
    """One kind of database. ``parent``/``item``/``event`` are ``(table, singular noun)``; a table's
    plural noun is its name with spaces for underscores."""

    name: str
    parent: tuple[str, str]
    parent_cat: Cat
    parent_num: Num
    item: tuple[str, str]
    item_title: str  # the item's name column: "name" or "title"
    item_cat: Cat
    item_num: Num
    item_real: Num
    item_opt: Num  # NULL for about a fifth of the items
    event: tuple[str, str]
    event_year: Num
    event_qty: Num
    event_status: Cat

    @property
    def parent_fk(self) -> str:
        return f"{self.parent[1].replace(' ', '_')}_id"

    @property
    def item_fk(self) -> str:
        return f"{self.item[1].replace(' ', '_')}_id"

    def schema(self) -> dict[str, list[tuple[str, str]]]:
        """Table -> ``[(column, SQL type)]``, in creation order."""
        return {
            self.parent[0]: [("id", "INTEGER PRIMARY KEY"), ("name", "TEXT"), (self.parent_cat.col, "TEXT"),
                             (self.parent_num.col, "INTEGER")],
            self.item[0]: [("id", "INTEGER PRIMARY KEY"), (self.item_title, "TEXT"),
                           (self.parent_fk, f"INTEGER REFERENCES {self.parent[0]}(id)"), (self.item_cat.col, "TEXT"),
                           (self.item_num.col, "INTEGER"), (self.item_real.col, "REAL"), (self.item_opt.col, "INTEGER")],
            self.event[0]: [("id", "INTEGER PRIMARY KEY"), (self.item_fk, f"INTEGER REFERENCES {self.item[0]}(id)"),
                            (self.event_year.col, "INTEGER"), (self.event_qty.col, "INTEGER"),
                            (self.event_status.col, "TEXT")],
        }


def _d(name, parent, pcat, pnum, item, title, icat, inum, ireal, iopt, event, eyear, eqty, estatus) -> Domain:
    return Domain(name, parent, Cat(*pcat), Num(*pnum), item, title, Cat(*icat), Num(*inum), Num(*ireal), Num(*iopt),
                  event, Num(*eyear), Num(*eqty), Cat(*estatus))


TRAIN_DOMAINS: tuple[Domain, ...] = (
    _d("library", ("authors", "author"), ("country", "country", ("Norvia", "Estmark", "Valdor", "Pellan", "Ruthen")),
       ("birth_year", "birth year", 1900, 1995), ("books", "book"), "title",
       ("genre", "genre", ("fantasy", "history", "poetry", "science", "mystery", "travel")),
       ("pages", "number of pages", 60, 900), ("price", "price", 4, 80), ("rating", "rating", 1, 10),
       ("loans", "loan"), ("loan_year", "year", 2016, 2024), ("days", "number of days", 1, 30),
       ("loan_status", "status", ("returned", "late", "lost"))),
    _d("retail", ("suppliers", "supplier"), ("region", "region", ("north", "south", "east", "west", "central")),
       ("founded_year", "founding year", 1950, 2020), ("products", "product"), "name",
       ("category", "category", ("tools", "garden", "kitchen", "toys", "office", "sports")),
       ("stock", "stock", 0, 500), ("unit_price", "unit price", 1, 300), ("discount", "discount", 5, 40),
       ("sales", "sale"), ("sale_year", "year", 2017, 2024), ("quantity", "quantity", 1, 20),
       ("channel", "channel", ("online", "store", "phone"))),
    _d("school", ("teachers", "teacher"), ("department", "department", ("math", "physics", "art", "biology", "music")),
       ("hired_year", "hiring year", 1985, 2022), ("courses", "course"), "title",
       ("format", "format", ("lecture", "seminar", "lab", "online", "workshop")),
       ("credits", "number of credits", 1, 8), ("fee", "fee", 50, 900), ("capacity", "capacity", 10, 120),
       ("enrollments", "enrollment"), ("term_year", "year", 2015, 2024), ("grade", "grade", 40, 100),
       ("outcome", "outcome", ("passed", "failed", "withdrew"))),
    _d("music", ("artists", "artist"), ("origin", "origin", ("Lunport", "Kestrel Bay", "Mardale", "Orvel", "Sandris")),
       ("debut_year", "debut year", 1960, 2020), ("albums", "album"), "title",
       ("style", "style", ("jazz", "rock", "folk", "electronic", "classical", "soul")),
       ("tracks", "number of tracks", 4, 24), ("list_price", "list price", 5, 40),
       ("critic_score", "critic score", 1, 100), ("streams", "stream"), ("stream_year", "year", 2018, 2024),
       ("plays", "number of plays", 10, 5000), ("platform", "platform", ("radio", "app", "web"))),
    _d("sports", ("clubs", "club"), ("league", "league", ("premier", "first", "second", "regional")),
       ("founded", "founding year", 1880, 2010), ("players", "player"), "name",
       ("position", "position", ("goalkeeper", "defender", "midfielder", "forward")),
       ("goals", "number of goals", 0, 40), ("salary", "salary", 20, 900), ("injuries", "number of injuries", 0, 9),
       ("appearances", "appearance"), ("season", "season", 2015, 2024), ("minutes", "minutes played", 1, 90),
       ("result", "result", ("win", "draw", "loss"))),
    _d("clinic", ("doctors", "doctor"), ("specialty", "specialty", ("cardiology", "dermatology", "neurology",
                                                                    "pediatrics", "oncology")),
       ("licensed_year", "licensing year", 1975, 2021), ("patients", "patient"), "name",
       ("blood_type", "blood type", ("A", "B", "AB", "O")), ("age", "age", 1, 95), ("bill", "bill", 30, 2000),
       ("severity", "severity", 1, 5), ("visits", "visit"), ("visit_year", "year", 2016, 2024),
       ("duration_min", "duration in minutes", 5, 120), ("visit_type", "visit type", ("checkup", "emergency", "follow-up"))),
    _d("cinema", ("studios", "studio"), ("city", "city", ("Brannock", "Corvale", "Delmont", "Farrow", "Hollis")),
       ("established", "founding year", 1910, 2015), ("movies", "movie"), "title",
       ("certificate", "certificate", ("U", "PG", "12", "15", "18")),
       ("runtime", "runtime in minutes", 70, 210), ("budget", "budget", 1, 250), ("box_score", "box-office score", 1, 100),
       ("screenings", "screening"), ("screen_year", "year", 2015, 2024), ("audience", "audience", 5, 400),
       ("screen_format", "format", ("2D", "3D", "IMAX"))),
    _d("farming", ("farms", "farm"), ("province", "province", ("Alder", "Brook", "Cedar", "Dunmore", "Elm")),
       ("acres", "size in acres", 20, 3000), ("fields", "field"), "name",
       ("soil", "soil type", ("clay", "loam", "sand", "silt", "peat")),
       ("plants", "number of plants", 100, 9000), ("seed_cost", "seed cost", 10, 800),
       ("yield_score", "yield score", 1, 100), ("harvests", "harvest"), ("harvest_year", "year", 2014, 2024),
       ("tonnes", "tonnes harvested", 1, 60), ("quality", "quality", ("premium", "standard", "poor"))),
    _d("transit", ("depots", "depot"), ("district", "district", ("harbor", "uptown", "midtown", "riverside", "airport")),
       ("opened_year", "opening year", 1930, 2020), ("buses", "bus"), "name",
       ("model", "model", ("city", "coach", "minibus", "electric", "articulated")),
       ("seats", "number of seats", 12, 90), ("fare", "fare", 1, 12), ("mileage_k", "mileage in thousands", 5, 900),
       ("trips", "trip"), ("trip_year", "year", 2016, 2024), ("passengers", "number of passengers", 1, 120),
       ("punctuality", "punctuality", ("on time", "delayed", "cancelled"))),
    _d("restaurant", ("chefs", "chef"), ("cuisine", "cuisine", ("italian", "thai", "mexican", "french", "indian")),
       ("career_start", "career start year", 1970, 2020), ("dishes", "dish"), "name",
       ("course", "course", ("starter", "main", "dessert", "side", "drink")),
       ("calories", "calories", 50, 1500), ("menu_price", "menu price", 2, 60), ("spice_level", "spice level", 0, 5),
       ("orders", "order"), ("order_year", "year", 2017, 2024), ("portions", "number of portions", 1, 12),
       ("service", "service", ("dine-in", "takeaway", "delivery"))),
)

TEST_DOMAINS: tuple[Domain, ...] = (
    _d("observatory", ("observatories", "observatory"), ("hemisphere", "hemisphere", ("boreal", "austral", "equatorial")),
       ("altitude", "altitude", 200, 5200), ("telescopes", "telescope"), "name",
       ("mirror_type", "mirror type", ("parabolic", "spherical", "segmented", "liquid")),
       ("aperture_cm", "aperture in centimetres", 20, 1000), ("cost_musd", "cost in millions", 1, 900),
       ("downtime_days", "downtime in days", 0, 60), ("observations", "observation"), ("obs_year", "year", 2010, 2023),
       ("exposure_min", "exposure in minutes", 1, 300), ("sky_quality", "sky quality", ("pristine", "hazy", "cloudy"))),
    _d("shipyard", ("shipyards", "shipyard"), ("coast", "coast", ("windward", "leeward", "gulf", "fjord")),
       ("dock_count", "number of docks", 1, 40), ("vessels", "vessel"), "name",
       ("hull_class", "hull class", ("trawler", "schooner", "tanker", "ferry", "tug")),
       ("tonnage", "tonnage", 50, 90000), ("insured_value", "insured value", 1, 500),
       ("refits", "number of refits", 0, 12), ("voyages", "voyage"), ("voyage_year", "year", 2009, 2023),
       ("cargo_tons", "cargo in tons", 1, 8000), ("sea_state", "sea state", ("calm", "choppy", "stormy"))),
    _d("vineyard", ("estates", "estate"), ("valley", "valley", ("Quixa", "Zembre", "Yvrac", "Xaloz")),
       ("hectares", "size in hectares", 2, 400), ("wines", "wine"), "name",
       ("grape", "grape", ("riesling", "syrah", "gamay", "malbec", "viognier")),
       ("bottles", "number of bottles", 300, 60000), ("cellar_price", "cellar price", 6, 350),
       ("tasting_score", "tasting score", 50, 100), ("tastings", "tasting"), ("tasting_year", "year", 2008, 2023),
       ("panel_size", "panel size", 2, 25), ("verdict", "verdict", ("superb", "sound", "faulty"))),
    _d("apiary", ("apiaries", "apiary"), ("terrain", "terrain", ("heath", "orchard", "meadow", "moor")),
       ("elevation_m", "elevation in metres", 0, 2500), ("hives", "hive"), "name",
       ("bee_breed", "bee breed", ("carniolan", "buckfast", "caucasian", "ligustica")),
       ("frames", "number of frames", 5, 40), ("honey_value", "honey value", 10, 900),
       ("swarm_count", "number of swarms", 0, 8), ("inspections", "inspection"), ("inspection_year", "year", 2011, 2023),
       ("mites_found", "number of mites found", 0, 300), ("colony_mood", "colony mood", ("docile", "nervous", "aggressive"))),
    _d("archive", ("archives", "archive"), ("climate_zone", "climate zone", ("arid", "humid", "temperate", "polar")),
       ("vault_count", "number of vaults", 1, 60), ("manuscripts", "manuscript"), "name",
       ("script", "script", ("uncial", "runic", "cursive", "glyphic", "minuscule")),
       ("folios", "number of folios", 4, 600), ("appraisal", "appraisal", 1, 999),
       ("damage_pct", "damage percentage", 0, 90), ("consultations", "consultation"),
       ("consult_year", "year", 2005, 2023), ("hours", "hours of study", 1, 40),
       ("purpose", "purpose", ("restoration", "scholarship", "exhibition"))),
    _d("conservatory", ("conservatories", "conservatory"), ("biome", "biome", ("tropical", "alpine", "desert", "wetland")),
       ("glass_panes", "number of glass panes", 100, 20000), ("specimens", "specimen"), "name",
       ("plant_family", "plant family", ("orchidaceae", "cactaceae", "fabaceae", "araceae", "ericaceae")),
       ("height_cm", "height in centimetres", 2, 900), ("acquisition_fee", "acquisition fee", 3, 700),
       ("bloom_days", "days in bloom", 0, 120), ("waterings", "watering"), ("water_year", "year", 2012, 2023),
       ("litres", "litres", 1, 90), ("leaf_state", "leaf state", ("lush", "wilted", "spotted"))),
)

# Entity names are made of syllables. Every held-out syllable holds a letter (q, x, y or z) that no
# training syllable has, so no held-out name can equal a training one.
TRAIN_SYLLABLES = ("ka", "lo", "mi", "ra", "ven", "tor", "sel", "dru", "an", "bel", "cor", "fen", "gal", "hir", "is",
                   "jun", "mar", "nol", "pen", "ros", "sa", "tam", "ul", "vor", "wen", "del", "ob", "ith", "mun", "ard")
TEST_SYLLABLES = ("qua", "xel", "zor", "yin", "zab", "quo", "xan", "yel", "zim", "oyx", "qir", "zep", "yar", "xo",
                  "azu", "quel", "zyn", "yom", "xir", "zed", "ky", "qen", "uzo", "vyx")
SYLLABLES = {"train": TRAIN_SYLLABLES, "test": TEST_SYLLABLES}
DOMAINS = {"train": TRAIN_DOMAINS, "test": TEST_DOMAINS}
