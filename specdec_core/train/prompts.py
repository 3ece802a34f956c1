"""The draft's training prompt set ``data/prompts/train.jsonl``: deterministic, seed-driven, disjoint from
the eval mix (its command line: ``scripts/make_train_prompts.py``).

Prompts are templates × topics of this project's own (no external data), one JSON object a line in
the evaluation mix's format (``id``, ``task``, ``category``, ``turns``, ``length``; see
:mod:`specdec_core.data.prompts`) so the same loader reads both. Tasks and categories reuse the eval
mix's names, but every text here is built from the tables below, never from ``eval.jsonl``;
:func:`check_disjoint` refuses a prompt whose first turn shares a 10-word run with an eval prompt.
Passages for summarization / RAG / extraction are fictional documents assembled from slot-filled
sentence templates.
"""
from __future__ import annotations

import json
import random
import re
from pathlib import Path

from ..data.prompts import DEFAULT_PATH as EVAL_PATH, MT_CATEGORIES, length_of
from ..paths import PROMPTS_DIR

TRAIN_PATH = PROMPTS_DIR / "train.jsonl"
SEED = 20240611

TOPICS = [
    "volcanoes", "honeybees", "the printing press", "solar panels", "coral reefs", "the immune system",
    "black holes", "composting", "the Roman aqueducts", "electric cars", "sourdough bread", "glaciers",
    "the water cycle", "photosynthesis", "earthquakes", "the Silk Road", "vaccines", "recycling plastic",
    "wind turbines", "the human heart", "chess openings", "jazz music", "origami", "the stock market",
    "public libraries", "bicycles", "tea ceremonies", "submarines", "rainforests", "the moon landing",
    "lighthouses", "sleep", "coffee farming", "the metric system", "bridges", "migratory birds",
    "3D printing", "the Renaissance", "tides", "deserts", "compound interest", "antibiotics",
    "the internet", "board games", "mushrooms", "hurricanes", "ancient Egypt", "wolves", "batteries",
    "urban gardening", "the violin", "paper money", "satellites", "octopuses", "the Great Wall",
    "yoga", "typography", "nuclear fusion", "beekeeping", "marathon training", "minimalism",
    "the periodic table", "cloud computing", "penguins", "the Olympic Games", "weather forecasting",
    "pottery", "radio", "cheese making", "the Amazon river", "machine learning", "fossils", "telescopes",
    "time zones", "meditation", "trains", "desalination", "the camera", "kites", "dinosaurs",
]
AUDIENCES = ["a ten-year-old", "a busy manager", "a first-year student", "my grandmother", "a tourist",
             "a new employee", "a curious teenager", "a retired engineer"]
FORMS = ["a short poem", "a haiku", "a limerick", "a two-paragraph story", "a product description",
         "a tweet", "a motivational speech of about 100 words", "a diary entry", "a short dialogue",
         "a catchy slogan and a one-line explanation", "a formal letter", "a blog post introduction"]
PEOPLE = ["Maria", "Tom", "Aisha", "Kenji", "Lucas", "Priya", "Olga", "Samuel", "Fatima", "Chen", "Nora",
          "Diego", "Ingrid", "Kwame", "Hana", "Pavel"]
TOWNS = ["Millbrook", "Ashford", "Riverton", "Larkspur", "Eastvale", "Port Ellis", "Greywick", "Halden",
         "Oakmere", "Sunnybank", "Westford", "Brightwater"]
FACILITIES = ["library", "swimming pool", "community garden", "bike lane network", "health clinic",
              "concert hall", "bus station", "science museum", "skate park", "food market"]
COMPANIES = ["Northwind Labs", "Bluepeak Foods", "Kestrel Motors", "Lumen Textiles", "Orbit Logistics",
             "Cedar & Finch", "Quartz Analytics", "Harbor Tea Co."]
PRODUCTS = ["wireless headphones", "standing desk", "electric kettle", "hiking backpack", "smart watch",
            "air purifier", "coffee grinder", "e-reader", "robot vacuum", "camping stove"]
LANGS = ["French", "Spanish", "German", "Italian", "Portuguese", "Dutch", "Chinese", "Japanese"]
SUBJ = ["The old fisherman", "My younger sister", "The new manager", "Our neighbour's dog", "The museum guide",
        "A tired traveller", "The chef", "Every student in the class", "The city council", "The young pilot"]
VERB = ["repaired the broken fence", "forgot the keys at home", "painted the kitchen yellow",
        "missed the last train", "planted three apple trees", "wrote a letter to the mayor",
        "found a wallet in the park", "baked bread for the whole street", "learned to play the guitar",
        "cancelled the meeting"]
WHEN = ["yesterday evening", "last summer", "before breakfast", "during the storm", "on Monday",
        "after the concert", "every weekend", "in the middle of the night"]
WHY = ["because it was raining", "although nobody asked", "to surprise the family", "for the first time",
       "without saying a word", "despite the cold weather"]
LANGS_CODE = ["Python", "JavaScript", "C", "Rust", "Go", "SQL", "Bash", "Java"]
CODE_TASKS = ["reverses a string", "checks whether a number is prime", "counts the words in a text",
              "finds the largest element of a list", "merges two sorted lists", "computes the factorial of n",
              "removes duplicates from a list", "converts Celsius to Fahrenheit", "reads a CSV file and sums a column",
              "returns the n-th Fibonacci number", "checks whether a string is a palindrome",
              "flattens a nested list"]


def pick(rng: random.Random, xs):
    return xs[rng.randrange(len(xs))]


def sentence(rng):
    return f"{pick(rng, SUBJ)} {pick(rng, VERB)} {pick(rng, WHEN)} {pick(rng, WHY)}."


# -- fictional documents (for summarization, RAG, extraction) ---------------------------------------
def doc_news(rng):
    town, fac, who = pick(rng, TOWNS), pick(rng, FACILITIES), pick(rng, PEOPLE)
    y, cost, months, users = rng.randint(2015, 2024), rng.randint(2, 40), rng.randint(6, 36), rng.randint(3, 90) * 100
    return (f"The town of {town} opened its new {fac} on a sunny morning in {y}. The project cost {cost} million "
            f"dollars and took {months} months to finish, several months longer than planned. Mayor {who} said the "
            f"{fac} would serve about {users} residents every week and create new jobs for young people. Some "
            f"residents complained about the noise during construction, while local shop owners hope the new "
            f"{fac} will bring more visitors to the centre of {town}. A second phase, including a car park and "
            f"a small cafe, is expected to begin next year if the council approves the budget.")


def doc_meeting(rng):
    a, b, c = rng.sample(PEOPLE, 3)
    comp, pct, day = pick(rng, COMPANIES), rng.randint(3, 25), pick(rng, ["Tuesday", "Thursday", "Friday"])
    return (f"Minutes of the weekly team meeting at {comp}. Present: {a}, {b} and {c}. {a} reported that sales "
            f"grew by {pct} percent compared with the previous quarter, mostly thanks to online orders. {b} raised "
            f"concerns about delays from one supplier and proposed testing a second supplier for three months. "
            f"The team agreed. {c} will prepare a short survey for customers about delivery times and share the "
            f"results by {day}. The next meeting will focus on the hiring plan and the office move.")


def doc_review(rng):
    prod, comp, stars, days = pick(rng, PRODUCTS), pick(rng, COMPANIES), rng.randint(2, 5), rng.randint(5, 60)
    return (f"I bought the {prod} from {comp} about {days} days ago. Setting it up took less than ten minutes and "
            f"the instructions were clear. The build quality feels solid, although the buttons are a little stiff. "
            f"Battery life and performance have been better than I expected, but the price is higher than similar "
            f"products. Customer service answered my question within a day. Overall I would give it {stars} out of "
            f"5 stars and I would recommend it to anyone who uses a {prod} every day.")


def doc_science(rng):
    topic, n, pct = pick(rng, TOPICS), rng.randint(20, 400), rng.randint(10, 60)
    who, town = pick(rng, PEOPLE), pick(rng, TOWNS)
    return (f"A research group led by Dr. {who} at the University of {town} studied {topic} for three years. "
            f"They collected data from {n} sites and compared their measurements with older records. The team "
            f"found a change of about {pct} percent over the study period, which was larger than earlier models "
            f"had predicted. The authors say more work is needed, because the measurements were taken in only one "
            f"region and some equipment failed during the winter. They plan to share their data with other "
            f"groups and to repeat the study with better instruments.")


def doc_notice(rng):
    town, day, hour = pick(rng, TOWNS), pick(rng, ["Saturday", "Sunday", "Wednesday"]), rng.randint(8, 11)
    price, fac = rng.randint(2, 15), pick(rng, FACILITIES)
    return (f"Notice to residents of {town}: the {fac} will be closed for maintenance next week. On {day} it will "
            f"reopen at {hour} a.m. with new opening hours. Tickets will cost {price} dollars for adults, while "
            f"children under twelve and people over sixty-five can enter for free. Visitors are asked to use the "
            f"side entrance until the main door is repaired. Questions can be sent to the town office by email "
            f"or asked in person at the front desk.")


def doc_history(rng):
    topic, c1, c2 = pick(rng, TOPICS), rng.randint(11, 19), rng.randint(2, 9)
    return (f"The history of {topic} is longer than most people think. Early records from the {c1}th century "
            f"describe simple versions that were used by traders and farmers. Over the next {c2} hundred years, "
            f"better tools and new ideas changed how people understood {topic}. Schools began to teach it, "
            f"governments wrote rules about it, and writers made it popular with the public. Today {topic} is "
            f"studied around the world, and new discoveries continue to change our view of its past and future.")


DOCS = [doc_news, doc_meeting, doc_review, doc_science, doc_notice, doc_history]


def document(rng, n_docs=1):
    return "\n\n".join(pick(rng, DOCS)(rng) for _ in range(n_docs))


# -- tasks -------------------------------------------------------------------------------------------
def multi_turn(rng):
    topic, aud, form = pick(rng, TOPICS), pick(rng, AUDIENCES), pick(rng, FORMS)
    cat = pick(rng, MT_CATEGORIES)
    if cat == "writing":
        text = pick(rng, [f"Write {form} about {topic}.", f"Write {form} for {aud} about {topic}.",
                          f"Draft an email to {pick(rng, PEOPLE)} asking to reschedule our meeting about {topic}.",
                          f"Write an invitation to a small workshop on {topic} for {aud}.",
                          f"Give me five creative titles for an article about {topic}."])
    elif cat == "roleplay":
        text = pick(rng, [f"Pretend you are a tour guide in {pick(rng, TOWNS)}. Welcome a group of visitors.",
                          f"Act as a friendly librarian and recommend three books about {topic}.",
                          f"You are a chef. Describe your favourite dish to {aud}.",
                          f"Imagine you are an expert on {topic} giving a short interview. Answer: what got you "
                          f"interested in your field?", f"Role-play a shop assistant helping me choose a {pick(rng, PRODUCTS)}."])
    elif cat == "reasoning":
        a, b = rng.sample(PEOPLE, 2)
        text = pick(rng, [f"{a} is taller than {b}, and {b} is taller than {pick(rng, PEOPLE)}. Who is the shortest? "
                          "Explain your reasoning.", f"What are the pros and cons of {topic}? Answer in a short list.",
                          f"If all bloops are razzies and some razzies are lazzies, are some bloops lazzies? Explain.",
                          f"Compare {topic} and {pick(rng, TOPICS)}: how are they similar and how are they different?"])
    elif cat == "math":
        x, y = rng.randint(3, 99), rng.randint(3, 99)
        text = pick(rng, [f"What is {x} times {y}? Show your work.", f"Solve for x: {x}x + {y} = {x * 3 + y}.",
                          f"What is {x} percent of {y * 10}?", f"Explain how to add the fractions 1/{x % 9 + 2} and 1/{y % 7 + 2}.",
                          f"A rectangle is {x} cm long and {y} cm wide. What are its area and perimeter?"])
    elif cat == "coding":
        lang, task = pick(rng, LANGS_CODE), pick(rng, CODE_TASKS)
        text = pick(rng, [f"Write a {lang} function that {task}.", f"How do I write a program in {lang} that {task}?",
                          f"Explain what a for loop is in {lang}, with a short example.",
                          f"Write a {lang} function that {task}, and add a comment to each line."])
    elif cat == "extraction":
        text = pick(rng, ["List every person and every number mentioned in this text:\n\n",
                          "Extract the names, places and dates from the following text as a bullet list:\n\n",
                          "What are the key facts in this text? Answer as a JSON object:\n\n"]) + document(rng)
    elif cat == "stem":
        text = pick(rng, [f"Explain how {topic} works to {aud}.", f"What is the science behind {topic}?",
                          f"Describe three important facts about {topic}."])
    else:
        text = pick(rng, [f"Why was {topic} important in history?", f"How has {topic} influenced art and culture?",
                          f"Write a short essay on the social impact of {topic}."])
    return cat, [text]


def translation(rng):
    lang = pick(rng, LANGS)
    n = rng.choice([1, 1, 2, 3])
    body = " ".join(sentence(rng) for _ in range(n))
    text = pick(rng, [f"Translate the following text into {lang}:\n{body}", f"Translate to {lang}: {body}",
                      f"How would you say this in {lang}? \"{body}\"",
                      f"Please translate this English text into {lang}.\n\n{body}"])
    return "translation", [text]


def summarization(rng):
    doc = document(rng, rng.choice([1, 1, 2]))
    text = pick(rng, [f"Summarize the following text in two sentences.\n\n{doc}",
                      f"Write a one-paragraph summary of this article:\n\n{doc}",
                      f"{doc}\n\nSummarize the text above in three bullet points.",
                      f"Give a short summary (at most 50 words) of the following:\n{doc}"])
    return "summarization", [text]


def qa(rng):
    topic = pick(rng, TOPICS)
    text = pick(rng, [f"What is {topic}?", f"Why is {topic} important?", f"How does {topic} work?",
                      f"Who benefits most from {topic}?", f"What are common myths about {topic}?",
                      f"When did people first learn about {topic}?", f"Give me three interesting facts about {topic}.",
                      f"What should a beginner know about {topic}?", f"What is the difference between {topic} and {pick(rng, TOPICS)}?"])
    return "qa", [text]


def math_reasoning(rng):
    a, b, c = rng.randint(2, 40), rng.randint(2, 20), rng.randint(2, 9)
    who, other = rng.sample(PEOPLE, 2)
    item = pick(rng, ["apples", "stickers", "books", "marbles", "pencils", "cookies", "stamps", "tickets"])
    text = pick(rng, [
        f"{who} has {a} {item}. {other} gives {who} {b} more, and then {who} shares them equally among {c} friends. "
        f"How many {item} does each friend get? Think step by step.",
        f"A train travels at {a + 40} km per hour for {c} hours. How far does it travel? Explain your answer.",
        f"{who} buys {c} {item} at {b} dollars each and pays with a {100} dollar bill. How much change does {who} get?",
        f"A shop sells {item} in packs of {c}. {who} needs {a * c + b} {item}. How many packs must {who} buy?",
        f"The price of a {pick(rng, PRODUCTS)} is {a * 10} dollars. It is discounted by {b} percent. What is the new price?",
        f"{who} is {a} years old. {other} is {c} times as old as {who} was {min(b, a - 1)} years ago. How old is {other}?",
    ])
    return "math_reasoning", [text]


def rag(rng):
    doc = document(rng, rng.choice([1, 2]))
    q = pick(rng, ["What happened according to the text?", "Who is mentioned in the documents and what did they do?",
                   "What numbers are reported, and what do they refer to?", "What is planned for the future?",
                   "What problems are described?", "Which opinions are expressed in the context?"])
    text = pick(rng, [f"Answer the question using only the context below.\n\nContext:\n{doc}\n\nQuestion: {q}",
                      f"Read the following documents and answer: {q}\n\n{doc}",
                      f"Context: {doc}\n\nBased on the context, {q[0].lower() + q[1:]}"])
    return "rag", [text]


# (generator, weight): the eval mix's six tasks, multi_turn heavier (it spans eight categories); a generator's
# name is its task's
GENERATORS = [(multi_turn, 8), (translation, 3), (summarization, 3), (qa, 3), (math_reasoning, 3), (rag, 3)]


def draw(generators, n: int, seed: int, prefix: str, skip=lambda text: False) -> list[dict]:
    """``n`` distinct prompts ``<prefix>-NNNNN`` from weighted ``generators`` ((function, weight), ...), deterministic
    in ``seed``; a first turn already drawn, or one ``skip`` refuses, is drawn again. A generator returns
    ``(category, turns)`` (the task is :data:`TASK_OF`'s, else the generator's name) or a dict with ``task``,
    ``category``, ``turns`` and any further fields the row keeps. After 50 draws per prompt wanted without reaching
    ``n``, a ``ValueError`` says so (there are not that many distinct prompts to draw)."""
    rng = random.Random(seed)
    fns = [f for f, w in generators for _ in range(w)]
    rows, seen = [], set()
    for _ in range(50 * n):
        if len(rows) == n:
            return rows
        fn = pick(rng, fns)
        out = fn(rng)
        row = dict(out) if isinstance(out, dict) else dict(task=TASK_OF.get(fn, fn.__name__), category=out[0],
                                                          turns=out[1])
        text = row["turns"][0]
        if text in seen or skip(text):
            continue
        seen.add(text)
        rows.append(dict(id=f"{prefix}-{len(rows):05d}", task=row.pop("task"), category=row.pop("category"),
                         turns=row.pop("turns"), length=length_of(text), **row))
    if len(rows) < n:
        raise ValueError(f"drew only {len(rows)} of {n} distinct {prefix} prompts in {50 * n} tries: ask for fewer")
    return rows


def clear_of_eval(n_words: int = 8, exclude=frozenset()):
    """A ``skip`` for :func:`draw`: refuses a text in ``exclude`` or sharing an ``n_words``-word run with the eval mix."""
    ev = eval_grams(EVAL_PATH, n_words)
    return lambda text: text in exclude or bool(grams(text, n_words) & ev)


def build(n: int, seed: int = SEED) -> list[dict]:
    """``n`` distinct prompts of :data:`GENERATORS`, deterministic in ``seed``."""
    return draw(GENERATORS, n, seed, "train")


# -- more prompts where the first set is thin (``data/prompts/train_more.jsonl``) -----------------------
# The first set translates only *from* English and builds retrieval contexts as whole documents; the eval mix
# mostly translates *into* English (German, French, Spanish) and numbers its retrieved passages. These
# tables write short sentences in those three languages (subject + predicate + time, each table grammatical
# with every row of the others), and numbered passages of fictional facts.
FOREIGN = {
    "German": dict(
        subj=["Der alte Fischer", "Meine jüngere Schwester", "Der neue Direktor", "Unser Nachbar", "Die Lehrerin",
              "Ein müder Reisender", "Der Koch", "Die Bürgermeisterin", "Mein Großvater", "Das Kind"],
        pred=["hat den Zaun im Garten repariert", "hat die Schlüssel zu Hause vergessen",
              "hat die Küche gelb gestrichen", "hat den letzten Bus verpasst", "hat drei Bäume gepflanzt",
              "hat einen langen Brief geschrieben", "hat im Park eine Geldbörse gefunden",
              "hat Brot für die ganze Straße gebacken", "hat ein neues Fahrrad gekauft",
              "hat das Treffen abgesagt"],
        when=["gestern Abend", "letzten Sommer", "vor dem Frühstück", "während des Gewitters", "am Montag",
              "nach dem Konzert", "jedes Wochenende", "mitten in der Nacht"],
),
    "French": dict(
        subj=["Le vieux pêcheur", "Ma petite sœur", "Le nouveau directeur", "Notre voisin", "La professeure",
              "Un voyageur fatigué", "Le cuisinier", "La maire", "Mon grand-père", "L'enfant"],
        pred=["a réparé la clôture du jardin", "a oublié les clés à la maison", "a peint la cuisine en jaune",
              "a manqué le dernier bus", "a planté trois arbres", "a écrit une longue lettre",
              "a trouvé un portefeuille dans le parc", "a fait du pain pour toute la rue",
              "a acheté un nouveau vélo", "a annulé la réunion"],
        when=["hier soir", "l'été dernier", "avant le petit-déjeuner", "pendant l'orage", "lundi",
              "après le concert", "chaque week-end", "au milieu de la nuit"],
),
    "Spanish": dict(
        subj=["El viejo pescador", "Mi hermana menor", "El nuevo director", "Nuestro vecino", "La profesora",
              "Un viajero cansado", "El cocinero", "La alcaldesa", "Mi abuelo", "El niño"],
        pred=["reparó la valla del jardín", "olvidó las llaves en casa", "pintó la cocina de amarillo",
              "perdió el último autobús", "plantó tres árboles", "escribió una carta larga",
              "encontró una cartera en el parque", "hizo pan para toda la calle", "compró una bicicleta nueva",
              "canceló la reunión"],
        when=["ayer por la tarde", "el verano pasado", "antes del desayuno", "durante la tormenta", "el lunes",
              "después del concierto", "cada fin de semana", "en mitad de la noche"],
),
}


def foreign_sentence(rng, lang: str) -> str:
    t = FOREIGN[lang]
    subj, pred, when = pick(rng, t["subj"]), pick(rng, t["pred"]), pick(rng, t["when"])
    if lang == "German":  # perfect tense: the time phrase sits between the auxiliary and the object
        head, tail = pred.split(" ", 1)
        return f"{subj} {head} {when} {tail}."
    return f"{subj} {pred} {when}."


def translation_into_english(rng):
    lang = pick(rng, list(FOREIGN))
    body = " ".join(foreign_sentence(rng, lang) for _ in range(rng.choice([1, 1, 2, 3, 4])))
    text = pick(rng, [f"Translate this {lang} text into English:\n\n{body}", f"Into English, please: {body}",
                      f"What does this {lang} sentence mean in English? {body}",
                      f"Please give an English translation of the following {lang}:\n{body}",
                      f"{body}\n\nTranslate the text above from {lang} into English."])
    return "translation", [text]


def passage_facts(rng) -> list[str]:
    """Three to five numbered-passage facts about one fictional place (hours, prices, rules, plans)."""
    town, fac, who = pick(rng, TOWNS), pick(rng, FACILITIES), pick(rng, PEOPLE)
    name = f"the {town} {fac}"
    h1, h2, price, cap = rng.randint(7, 10), rng.randint(4, 9), rng.randint(2, 12), rng.randint(2, 9) * 10
    facts = [f"{name[0].upper() + name[1:]} is open from {h1} am to {h2} pm on weekdays and closes at noon on Sundays.",
             f"A day ticket for {name} costs {price} dollars; students pay half price and children under six are free.",
             f"Groups of more than {cap} people must book a visit to {name} at least one week in advance.",
             f"From next {pick(rng, ['March', 'June', 'September', 'November'])}, {name} will be managed by {who}, "
             f"who plans to add evening events once a month.",
             f"Parking near {name} is limited to two hours; the number {rng.randint(3, 40)} bus stops at the main "
             f"entrance every {rng.choice([10, 15, 20, 30])} minutes."]
    rng.shuffle(facts)
    return facts[:rng.randint(3, 5)]


def rag_passages(rng):
    facts = passage_facts(rng)
    ctx = "\n".join(f"Passage {i + 1}: {f}" for i, f in enumerate(facts))
    q = pick(rng, ["When is it open, and how much does a visit cost?", "What must a large group do before a visit?",
                   "Who will manage it, and what is planned?", "How can a visitor get there, and where can they park?",
                   "Summarize what a family of four should know before visiting."])
    text = pick(rng, [f"Use only the passages to answer.\n\n{ctx}\n\nQuestion: {q}",
                      f"Passages:\n{ctx}\n\nAnswer from the passages above: {q}",
                      f"{ctx}\n\nBased only on these passages, {q[0].lower() + q[1:]}"])
    return "rag", [text]


# the eval mix's six tasks in its proportions (16 multi-turn, 12 of each other task), the thin spots doubled
# inside their task: translation into English, numbered passages
MORE_GENERATORS = [(multi_turn, 16), (translation_into_english, 9), (translation, 3), (summarization, 12),
                   (qa, 12), (math_reasoning, 12), (rag_passages, 8), (rag, 4)]
TASK_OF = {translation_into_english: "translation", rag_passages: "rag"}  # generators not named after their task
MORE_PATH = PROMPTS_DIR / "train_more.jsonl"
MORE_SEED = 20261130


def build_more(n: int, seed: int = MORE_SEED, exclude: set[str] = frozenset()) -> list[dict]:
    """``n`` distinct prompts from :data:`MORE_GENERATORS` (ids ``more-NNNNN``), none of them in ``exclude``
    (the first set's first turns) and none sharing an 8-word run with the eval mix (those are drawn again)."""
    return draw(MORE_GENERATORS, n, seed, "more", skip=clear_of_eval(8, exclude))


def grams(text: str, n: int) -> set:
    """The ``n``-word runs of ``text`` (lower case, words = runs of letters and digits)."""
    w = re.findall(r"\w+", text.lower())
    return {tuple(w[i:i + n]) for i in range(len(w) - n + 1)}


def eval_grams(eval_path: Path = EVAL_PATH, n: int = 8) -> set:
    """Every ``n``-word run of every turn of the eval mix (empty without the file)."""
    out = set()
    if eval_path.exists():
        for line in eval_path.read_text().splitlines():
            if line.strip():
                for t in json.loads(line)["turns"]:
                    out |= grams(t, n)
    return out


def check_disjoint(rows: list[dict], eval_path: Path = EVAL_PATH, n_words: int = 10) -> None:
    """Raise ``ValueError`` if a training prompt's first turn shares an ``n_words``-word run with an eval prompt
    (no eval file: nothing to check)."""
    ev = eval_grams(eval_path, n_words)
    bad = [r["id"] for r in rows if grams(r["turns"][0], n_words) & ev]
    if bad:
        raise ValueError(f"training prompts overlap the eval mix ({len(bad)}): {bad[:5]}")


def to_jsonl(rows: list[dict]) -> str:
    """The file's text: one JSON object a line (UTF-8, not ASCII-escaped)."""
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
