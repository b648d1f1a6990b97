"""Synthetic prompt sets for self-distillation of a draft head.

Builds a diverse, deterministic set of user prompts (no network, no model) across nine
categories -- writing, roleplay, reasoning, math, coding, extraction, stem, humanities and
chat -- from instruction templates with slots and slot vocabularies. Math prompts carry
generated numbers; extraction prompts carry a generated short passage.

    python experiments/promptgen.py --out experiments/data/prompts --n 5000 --heldout 200
    python experiments/promptgen.py --out experiments/data/prompts --n 14000 --more train-more.jsonl

The second form writes only the prompts of an ``--n`` set that ``train.jsonl`` and ``heldout.jsonl``
do not already hold (each category's prompts are a fixed stream for a seed, so a larger set extends
a smaller one): more training data, the held-out set untouched.
"""
from __future__ import annotations

import argparse
import json
import random
import re
from collections import defaultdict
from fractions import Fraction
from math import gcd
from pathlib import Path
from typing import Callable

__all__ = ["CATEGORIES", "make_prompts", "write_prompt_sets"]

# category -> relative weight (chat gets a little less than the eight main categories)
CATEGORY_WEIGHTS = {
    "writing": 1.0, "roleplay": 1.0, "reasoning": 1.0, "math": 1.0, "coding": 1.0,
    "extraction": 1.0, "stem": 1.0, "humanities": 1.0, "chat": 0.75,
}
CATEGORIES = tuple(CATEGORY_WEIGHTS)

# ----------------------------------------------------------------------------------------
# template engine
# ----------------------------------------------------------------------------------------

_SLOT = re.compile(r"\{(A |\^)?([a-z_0-9]+)(#\d)?\}")


def _an(word: str) -> str:
    w = word.lower()
    if w.startswith(("uni", "use", "usu", "uti", "eu", "one", "once")):
        return "a"
    if w.startswith(("hour", "honest", "honor", "heir")):
        return "an"
    return "an" if w[:1] in "aeio" or (w[:1] == "u") else "a"


def fill(tpl: str, rng: random.Random, vocab: dict, fixed: dict | None = None) -> str:
    """Fill ``{slot}`` fields of ``tpl`` from ``vocab``. ``{A slot}`` prefixes a/an,
    ``{^slot}`` capitalizes, ``{slot#2}`` draws a second value distinct from ``{slot}``."""
    chosen = dict(fixed or {})
    used: dict[str, set] = defaultdict(set)
    for k, v in chosen.items():
        used[k.split("#")[0]].add(v)

    def sub(m: re.Match) -> str:
        mod, name, suf = m.group(1), m.group(2), m.group(3) or ""
        key = name + suf
        if key not in chosen:
            options = vocab[name]
            v = None
            for _ in range(30):
                v = options(rng) if callable(options) else rng.choice(options)
                if v not in used[name]:
                    break
            used[name].add(v)
            chosen[key] = v
        v = str(chosen[key])
        if mod == "A ":
            return f"{_an(v)} {v}"
        if mod == "^":
            return v[:1].upper() + v[1:]
        return v

    return _SLOT.sub(sub, tpl)


def _cap(s: str) -> str:
    s = s.strip()
    return s[:1].upper() + s[1:]


def _templated(templates: list[str], vocab: dict) -> Callable[[random.Random], str]:
    return lambda rng: fill(rng.choice(templates), rng, vocab)


# ----------------------------------------------------------------------------------------
# shared vocabularies
# ----------------------------------------------------------------------------------------

NAMES = [("Alice", "she"), ("Ben", "he"), ("Carmen", "she"), ("David", "he"), ("Elena", "she"),
         ("Farid", "he"), ("Grace", "she"), ("Hiro", "he"), ("Isabel", "she"), ("Jamal", "he"),
         ("Keiko", "she"), ("Liam", "he"), ("Maya", "she"), ("Noah", "he"), ("Olivia", "she"),
         ("Pedro", "he"), ("Priya", "she"), ("Omar", "he"), ("Sofia", "she"), ("Tom", "he"),
         ("Uma", "she"), ("Victor", "he"), ("Wendy", "she"), ("Yusuf", "he"), ("Zoe", "she"),
         ("Lena", "she"), ("Marco", "he"), ("Nina", "she"), ("Raj", "he"), ("Chloe", "she")]
NAME_LIST = [n for n, _ in NAMES]
CITIES = ["Lisbon", "Toronto", "Nairobi", "Osaka", "Melbourne", "Denver", "Krakow", "Seville", "Austin",
          "Edinburgh", "Bogota", "Hanoi", "Cape Town", "Vancouver", "Munich", "Porto", "Singapore",
          "Chicago", "Dublin", "Auckland", "Marseille", "Montreal", "Prague", "Istanbul", "Lima"]
HOBBIES = ["gardening", "hiking", "baking", "chess", "photography", "painting", "cycling", "knitting",
           "board games", "birdwatching", "rock climbing", "jazz music", "camping", "astronomy", "yoga",
           "video games", "pottery", "running", "fishing", "reading mysteries", "cooking spicy food",
           "woodworking", "dancing", "surfing", "collecting vinyl records"]
RELATIONS = ["my mom", "my dad", "my sister", "my brother", "my best friend", "my coworker", "my grandmother",
             "my grandfather", "my partner", "my teenage son", "my teenage daughter", "my boss", "my neighbor",
             "my roommate", "my uncle", "my aunt"]

# ----------------------------------------------------------------------------------------
# writing
# ----------------------------------------------------------------------------------------

W_VOCAB = {
    "nature": ["the first snow of winter", "a quiet mountain lake", "autumn leaves", "a thunderstorm at night",
               "the ocean at dawn", "a desert sunset", "cherry blossoms", "a foggy forest", "the full moon",
               "a spring rain", "fireflies in summer", "a frozen river", "wildflowers in a meadow",
               "migrating geese", "an old oak tree", "the tide going out", "a field of sunflowers"],
    "topic": ["friendship", "growing older", "moving to a new city", "the first day of school", "homesickness",
              "a rainy Sunday", "learning to ride a bike", "a lost letter", "the sound of trains", "coffee",
              "a grandmother's kitchen", "city lights", "starting over", "a long road trip", "the end of summer",
              "a forgotten photograph", "waiting for good news", "a small act of kindness", "the library",
              "a broken umbrella", "winning and losing", "a childhood home", "the night sky", "patience",
              "an empty playground", "the smell of fresh bread", "a stray cat", "hope", "time passing"],
    "abstract": ["hope", "regret", "courage", "loneliness", "gratitude", "change", "curiosity", "forgiveness",
                 "ambition", "memory", "joy", "silence", "freedom", "trust", "wonder"],
    "tone": ["a hopeful", "a melancholy", "a playful", "a reflective", "a gentle", "a dramatic", "a humorous",
             "a calm"],
    "character": ["retired astronaut", "nervous young chef", "lighthouse keeper", "talking parrot",
                  "shy robot", "old fisherman", "ambitious intern", "traveling musician", "village baker",
                  "forgetful wizard", "detective who is afraid of the dark", "librarian", "street magician",
                  "elderly gardener", "time traveler", "beekeeper", "young inventor", "night-shift nurse",
                  "dragon who hates fire", "mail carrier"],
    "plot": ["finds a mysterious key in the attic", "has to cross the city before midnight",
             "receives a letter addressed to someone who died fifty years ago",
             "wakes up able to understand animals", "loses the one thing they cannot replace",
             "must win a baking contest to save a family business", "gets stuck in an elevator with a stranger",
             "discovers a door that was not there yesterday", "tries to teach a cat to play chess",
             "befriends a ghost who lives in the basement", "plans a surprise party that goes wrong",
             "finds a map drawn by their younger self", "returns to their hometown after twenty years"],
    "quirk": ["always wore two hats", "could only speak in rhymes", "kept a goose as a pet",
              "baked bread at three in the morning", "was scared of spoons", "sang to the vegetables",
              "collected left shoes", "never stopped sneezing", "painted the town bright green"],
    "genre": ["mystery", "science fiction", "fantasy", "romance", "historical", "horror", "adventure",
              "thriller", "comedy"],
    "setting": ["a floating city", "a small fishing village in winter", "a space station orbiting Jupiter",
                "Victorian London", "a desert oasis", "an abandoned amusement park", "a mountain monastery",
                "a busy train station", "a lighthouse during a storm", "a future where it never stops raining",
                "an underwater research base", "a crowded night market"],
    "product": ["reusable water bottle", "noise-cancelling headphones", "standing desk", "smart plant pot",
                "handmade ceramic mug", "lightweight hiking backpack", "electric bicycle",
                "bar of organic lavender soap", "wireless phone charger", "travel pillow", "cast-iron skillet",
                "solar-powered lantern", "bamboo toothbrush", "pair of running shoes", "compact espresso maker"],
    "business": ["neighborhood bakery", "dog-walking service", "bike repair shop", "vegan food truck",
                 "yoga studio", "used bookstore", "language school", "coffee roastery", "plant nursery",
                 "cleaning company", "escape room", "ice cream parlor", "tutoring center"],
    "occasion": ["my best friend's wedding", "my parents' 40th anniversary", "a colleague's retirement party",
                 "my sister's graduation", "a team's championship celebration", "a farewell dinner for a coworker",
                 "a family reunion", "the opening of a new restaurant"],
    "audience": ["a high school soccer team", "first-year university students", "a group of volunteers",
                 "new employees", "a team of nurses", "a class of fifth graders", "a startup team"],
    "big_event": ["the final match of the season", "their final exams", "a charity marathon",
                  "a product launch", "a busy holiday weekend", "the first day of a new project"],
    "recipient_request": ["your landlord asking to fix a leaking faucet",
                          "your manager asking for a day off next Friday",
                          "a professor asking for an extension on an essay",
                          "a neighbor asking them to keep their dog quiet at night",
                          "a client asking for feedback on a draft",
                          "your team announcing a change in the meeting schedule",
                          "a hotel asking to change your booking dates",
                          "a former colleague asking for a letter of recommendation",
                          "a company asking for a refund on a damaged item",
                          "your child's teacher asking for a short meeting",
                          "a supplier asking why an order is late",
                          "a conference organizer asking about speaking opportunities"],
    "job": ["software developer", "graphic designer", "nurse", "marketing assistant", "data analyst",
            "teacher", "project manager", "barista", "electrician", "librarian", "sales representative",
            "accountant", "veterinary assistant", "social media manager", "chef"],
    "animal": ["fox", "tortoise", "crow", "lion", "mouse", "rabbit", "owl", "ant", "bear", "goat",
               "frog", "eagle", "snail", "wolf", "squirrel"],
    "virtue": ["patience", "honesty", "humility", "kindness", "hard work", "sharing", "courage",
               "listening to others", "gratitude"],
    "announcement": ["the opening of a new coffee shop", "a community clean-up day this Saturday",
                     "a new podcast episode", "a job opening on your team", "a charity bake sale",
                     "your company's tenth anniversary", "a free coding workshop for beginners",
                     "a new line of handmade candles", "the launch of a mobile app"],
    "claim": ["every student should learn to cook", "cities should have more bike lanes",
              "homework should be limited in primary school", "public libraries deserve more funding",
              "people should spend less time on their phones", "remote work benefits both employees and companies",
              "schools should start later in the morning", "everyone should learn a second language",
              "museums should be free to visit", "companies should offer a four-day work week"],
    "blog_topic": ["beginner houseplants", "budget travel in Europe", "meal prepping for busy weeks",
                   "learning to run your first 5K", "minimalist living", "starting a vegetable garden",
                   "working from home productively", "photography with a phone", "learning to play guitar"],
    "place": ["a busy farmers' market", "an empty beach", "a snowy cabin", "a crowded subway car",
              "an old library", "a rooftop garden", "a small-town diner", "a rainforest", "a night market",
              "a train crossing the countryside"],
    "time_of_day": ["dawn", "noon", "dusk", "midnight", "early morning", "late afternoon"],
    "informal": ["hey, can u send me that report asap?", "we gotta fix this bug before the boss sees it",
                 "thanks a ton for the help, you're a lifesaver", "sorry I'm late, traffic was crazy",
                 "the meeting's pushed to tmrw, cool?", "this plan is kinda messy tbh",
                 "gonna need more time on the project, my bad", "can we chat about the budget thing later?",
                 "the new software is super buggy and annoying"],
    "wordy": ["At this point in time, we are currently in the process of reviewing the document.",
              "Due to the fact that it was raining, the game was postponed until a later date.",
              "In my personal opinion, I think that the plan might possibly work.",
              "She made the decision to make a change to the schedule.",
              "It is absolutely essential that everyone arrives on time without being late.",
              "The reason why he was absent is because he was feeling sick.",
              "We would like to take this opportunity to thank each and every one of you."],
    "age": ["four", "five", "six", "seven", "eight"],
    "creature": ["sleepy dragon", "brave little snail", "cloud that wanted to be a rainbow", "lost penguin",
                 "friendly monster under the bed", "tiny elephant", "owl who could not stay awake at night",
                 "turtle who wanted to fly", "star that fell into a garden"],
    "discovery": ["a hidden room behind a bookshelf", "a diary written in code", "footprints leading into a lake",
                  "a clock that runs backward", "an unsigned painting of themselves", "a locked box with their name on it"],
    "news_event": ["a local library reaching one million visitors", "a town building its first solar farm",
                   "a high school robotics team winning a national prize", "a rare bird spotted in a city park",
                   "a bakery donating bread to a shelter every day", "a new bridge opening to cyclists"],
    "word": ["SPRING", "OCEAN", "FRIEND", "HOPE", "MUSIC", "COFFEE", "GARDEN", "DREAM", "LIGHT", "HOME"],
    "gift": ["a handwritten birthday card", "helping me move apartments", "a home-cooked dinner",
             "a book recommendation that changed my year", "looking after my plants while I traveled",
             "a surprise visit", "mentoring me during my first job"],
    "mistake": ["missing their birthday party", "forgetting to reply to their message",
                "being late to our meeting", "breaking a borrowed umbrella", "snapping at them during a stressful day"],
    "person": ["a teacher", "a neighbor", "a coworker", "an old friend", "a mentor", "my aunt", "a classmate"],
    "scifi_premise": ["humans can only sleep once a week", "the moon starts to drift away from Earth",
                      "every person has a robot twin", "memories can be bought and sold",
                      "a message arrives from a star that no longer exists", "plants learn to talk"],
    "award": ["best community volunteer", "most improved player", "teacher of the year",
              "best short film", "innovation in science", "lifetime achievement in music"],
    "length": ["", "", "", " Keep it under 150 words.", " Keep it short.", " Use about 100 words.",
               " Make it no longer than two paragraphs.", " Aim for around 120 words."],
}

W_TEMPLATES = [
    "Write a haiku about {nature}.",
    "Write a short poem about {topic}.{length}",
    "Write {tone} poem about {abstract}.",
    "Write a free-verse poem about {topic} in four short stanzas.",
    "Write a limerick about {A character} who {quirk}.",
    "Write a short story about {A character} who {plot}.{length}",
    "Write a 150-word story in which {A character} {plot}.",
    "Write the opening paragraph of {A genre} novel set in {setting}.",
    "Write the first scene of {A genre} story set in {setting}. End on a cliffhanger.",
    "Write a product description for {A product}.{length}",
    "Write a catchy product description for {A product}, aimed at busy professionals.",
    "Write three slogans for {A business}.",
    "Write a short, friendly email to {recipient_request}.",
    "Write a polite and concise email to {recipient_request}.",
    "Write the opening paragraph of a cover letter for {A job} position.",
    "Write a short toast for {occasion}.",
    "Write a short motivational speech for {audience} before {big_event}.",
    "Write a fable about {A animal} and {A animal#2} that teaches a lesson about {virtue}.",
    "Write a short dialogue between {A character} and {A character#2} about {topic}.",
    "Write a social media post announcing {announcement}.",
    "Write a persuasive paragraph arguing that {claim}.",
    "Write a short opinion piece arguing that {claim}. Include one counterargument.",
    "Write an introduction for a blog post about {blog_topic}.",
    "Write a catchy title and a short introduction for a blog post about {blog_topic}.",
    "Describe {place} at {time_of_day} using vivid sensory details.",
    "Rewrite the following message in a more formal tone: \"{informal}\"",
    "Rewrite this sentence to be more concise: \"{wordy}\"",
    "Write a short bedtime story for {A age}-year-old about {A creature}.",
    "Write a diary entry from the point of view of {A character} at the end of a long day.",
    "Write a short mystery scene in which {A character} discovers {discovery}.",
    "Write a news headline and a short opening paragraph about {news_event}.",
    "Write an acrostic poem using the word {word}.",
    "Write a job advertisement for {A job} at {A business}.",
    "Write a thank-you note to {person} for {gift}.",
    "Write a short, sincere apology message to {person} for {mistake}.",
    "Write song lyrics, one verse and a chorus, about {topic}.",
    "Write a short science fiction story set in a world where {scifi_premise}.{length}",
    "Write a short acceptance speech for an award for {award}.",
    "Write a tagline and a two-sentence movie pitch about {A character} who {plot}.",
    "Write a letter from {A character} to their younger self.",
    "Write a two-paragraph travel brochure description of {city}.",
    "Write a short review of {A visited} you visited recently. Make it balanced.",
    "Write a birthday message for {relation}, who loves {hobby}.",
    "Write a short speech that {A job} could give on their last day at work.",
]
W_VOCAB.update({"visited": ["neighborhood bakery", "ice cream parlor", "used bookstore", "escape room", "yoga studio",
                            "coffee roastery", "vegan food truck", "ramen shop", "art museum", "farmers' market"],
                "city": CITIES, "relation": RELATIONS, "hobby": HOBBIES})

# ----------------------------------------------------------------------------------------
# roleplay
# ----------------------------------------------------------------------------------------

ROLES = [
    ("medieval blacksmith", ["how to care for a newly forged sword", "why good steel takes so long to make"]),
    ("pirate captain", ["where the crew should sail next", "why you never trust a calm sea"]),
    ("friendly librarian", ["how to find a good book for a rainy day", "why libraries still matter"]),
    ("personal fitness trainer", ["how to start exercising after a long break", "how to stay motivated in winter"]),
    ("barista at a busy cafe", ["the difference between a latte and a flat white", "how to make good coffee at home"]),
    ("park ranger", ["what to do if you meet a bear on a trail", "how to leave no trace while camping"]),
    ("museum tour guide", ["why a famous painting is so valuable", "how museums protect old artifacts"]),
    ("starship captain", ["how the crew should prepare for a meteor storm", "what it feels like to see Earth from far away"]),
    ("wise old wizard", ["how a young apprentice should begin studying magic", "why magic always has a price"]),
    ("detective in 1920s Chicago", ["what clues you look for at a crime scene", "how you know when someone is lying"]),
    ("professional chef", ["how to cook a perfect omelet", "how to keep a kitchen calm during a dinner rush"]),
    ("kindergarten teacher", ["how to handle a child who will not share", "how to make learning the alphabet fun"]),
    ("astronaut on the International Space Station", ["how you sleep in space", "what you miss most about Earth"]),
    ("ship's cook on a long voyage", ["how you keep food fresh for months", "what the sailors love to eat"]),
    ("lighthouse keeper", ["what a stormy night is like", "how the lighthouse lamp works"]),
    ("travel agent", ["how to plan a budget trip to Japan", "what to do when a flight is cancelled"]),
    ("car mechanic", ["why a car might make a squealing noise", "how often oil should be changed"]),
    ("Roman centurion", ["what daily life is like in the legion", "how soldiers prepare for a long march"]),
    ("farmer", ["how to tell when tomatoes are ready to pick", "what a farmer worries about most in spring"]),
    ("career coach", ["how to prepare for a job interview", "how to ask for a raise"]),
    ("history professor", ["why the printing press changed the world", "how historians know what happened long ago"]),
    ("tech support agent", ["how to fix a laptop that will not connect to Wi-Fi", "why restarting a computer helps"]),
    ("zookeeper", ["how you keep the penguins healthy", "which animal is the hardest to care for"]),
    ("news anchor", ["what the weather will be like this week", "what the top local story is today"]),
    ("mountain guide", ["how to prepare for a high-altitude climb", "when to turn back before the summit"]),
    ("video game shopkeeper", ["which potion a new adventurer should buy", "why the legendary sword costs so much"]),
    ("gardener at a royal palace", ["how you keep the roses blooming", "the secrets of the palace hedge maze"]),
    ("nervous tour bus driver", ["the route for today's trip", "what happened on your worst tour ever"]),
]
ROLE_ACTIONS = [
    "introduce yourself to a new apprentice", "describe a typical day at work",
    "describe the best and worst parts of your job", "tell a short story about the most memorable day of your career",
    "give three pieces of advice to someone starting out in your line of work",
    "describe your workplace to someone who has never seen it", "write a short diary entry about today",
    "complain good-naturedly about the hardest part of your job", "explain which tools you use every day",
    "give a short welcome speech to a group of visitors",
]
SUPPORT_CASES = [
    ("an online shoe store", "My order arrived two weeks late and the shoes are the wrong size. I want a refund."),
    ("an internet provider", "My internet has been cutting out every evening for a week. This is unacceptable."),
    ("a food delivery app", "My food arrived cold and half of my order was missing."),
    ("a gym", "I tried to cancel my membership three times and you keep charging me."),
    ("an airline", "My luggage did not arrive with my flight and I have a meeting tomorrow morning."),
    ("a furniture company", "The table I bought is missing two screws and I can't assemble it."),
    ("a phone company", "I was charged twice for this month's bill."),
    ("a hotel chain", "The room I booked had no hot water and the staff ignored my complaint."),
    ("a streaming service", "The app keeps logging me out in the middle of movies."),
    ("a bank", "I don't recognize a transaction on my account from yesterday."),
    ("a software company", "Your latest update deleted all of my saved settings."),
    ("a bookstore", "I received a book with several pages torn out."),
]
TUTOR_CASES = [
    ("math", "how to add fractions with different denominators"), ("math", "what a negative exponent means"),
    ("chemistry", "how to balance a chemical equation"), ("physics", "why heavy and light objects fall at the same rate"),
    ("biology", "the difference between mitosis and meiosis"), ("English", "when to use a semicolon"),
    ("history", "why World War I started"), ("programming", "what a for loop does"),
    ("Spanish", "when to use 'ser' and when to use 'estar'"), ("statistics", "what a p-value means"),
    ("economics", "why prices rise when demand increases"), ("geometry", "how to find the area of a triangle"),
    ("music theory", "what a major scale is"), ("French", "how to use the passé composé"),
]
FIGURE_EVENTS = [
    ("Christopher Columbus", "your first sight of land in 1492"), ("Marie Curie", "the day you discovered radium"),
    ("Leonardo da Vinci", "painting the Mona Lisa"), ("Neil Armstrong", "stepping onto the Moon"),
    ("William Shakespeare", "the opening night of Hamlet"), ("Cleopatra", "meeting Julius Caesar"),
    ("Isaac Newton", "your ideas about gravity"), ("Amelia Earhart", "flying solo across the Atlantic"),
    ("Charles Darwin", "your voyage on the Beagle"), ("Ada Lovelace", "your thoughts on Babbage's Analytical Engine"),
    ("Benjamin Franklin", "your famous kite experiment"), ("Galileo Galilei", "looking at Jupiter's moons for the first time"),
    ("Mozart", "composing music as a child"), ("Florence Nightingale", "your work in the Crimean War hospitals"),
]
RP_VOCAB = {
    "action": ROLE_ACTIONS,
    "city": CITIES,
    "fantasy_char": ["grumpy dwarf innkeeper", "elf archer guarding the border", "wandering bard", "troll who guards a bridge",
                     "village witch", "retired knight", "goblin merchant"],
    "fantasy_place": ["the Crystal Caves", "the capital city", "the old ruined tower", "the Whispering Forest",
                      "the dragon's mountain", "the harbor town of Saltmere"],
    "hero": ["knight who has lost their sword", "young thief", "traveling healer", "curious scholar",
             "shipwrecked sailor", "space explorer"],
    "location": ["at the entrance of an ancient temple", "on the deck of a sinking ship", "in a dark forest at night",
                 "in front of a locked castle gate", "in an abandoned space station", "at a crossroads in the desert"],
    "object": ["old umbrella", "library book", "city bus", "coffee mug", "pair of running shoes", "grandfather clock",
               "school backpack", "street lamp", "smartphone", "kitchen refrigerator", "red balloon", "park bench"],
    "pet": ["house cat", "golden retriever", "goldfish", "parrot", "hamster", "tortoise"],
    "match": ["tied soccer final", "close basketball game", "chess championship", "marathon finish",
              "snail race at the county fair", "tennis match at match point", "cooking competition"],
    "car": ["very old minivan", "bright yellow sports car", "tiny electric car", "rusty pickup truck"],
    "job": W_VOCAB["job"],
    "crime": ["a stolen painting", "a missing prize-winning cake", "a broken shop window", "a vanished diamond necklace"],
    "subject": ["a busy restaurant", "a small bookshop", "a flower shop", "a bakery"],
}
RP_TEMPLATES_GENERIC = [
    "You are {A role}. {^action}, staying in character.",
    "Roleplay as {A role}: {action}.",
    "Stay in character as {A role} and {action}.",
    "Pretend you are {A role}. Please {action}.",
]
RP_TEMPLATES_ASK = [
    "Pretend you are {A role}. A visitor asks you {ask}. Respond in character.",
    "You are {A role}. Explain {ask} to a curious child, in character.",
    "Act as {A role}. Someone wants to know {ask}. Answer them in your own voice.",
    "I'd like you to play {A role}. Tell me {ask}.",
]
RP_TEMPLATES_OTHER = [
    "You are a customer support agent for {company}. A customer writes: \"{complaint}\" Write a helpful reply.",
    "Act as a support representative for {company}. Respond politely to this message: \"{complaint}\"",
    "You are a patient {tsubject} tutor. I'm confused about {ttopic}. Help me understand it step by step.",
    "Act as my {tsubject} tutor and explain {ttopic}, then ask me one question to check that I understood.",
    "Pretend you are {figure}. Describe {fevent} from your point of view.",
    "Imagine you are {figure} giving an interview. Talk about {fevent}.",
    "You are {A fantasy_char} in a fantasy kingdom. A traveler asks you for directions to {fantasy_place}. Reply in character.",
    "Play {A fantasy_char}. A group of adventurers walks in and asks about rumors of treasure near {fantasy_place}. What do you tell them?",
    "You are a local tour guide in {city}. Greet a group of tourists and describe the plan for the day.",
    "Act as the narrator of a text adventure game. I am {A hero} standing {location}. Describe the scene and give me three choices.",
    "Pretend you are {A object}. Describe your life from your own point of view.",
    "You are {A object} that has just been thrown away. Tell your story in the first person.",
    "Pretend you are my {pet}. Tell me what you really think about my daily routine.",
    "You are a sports commentator. Describe the final seconds of {A match}.",
    "Roleplay as a used car salesperson trying to sell me {A car}. Be enthusiastic but honest.",
    "Act as a hiring manager interviewing me for {A job} position. Start by introducing yourself and asking your first question.",
    "You are a detective questioning a witness about {crime}. Write your opening questions.",
    "Pretend you are the owner of {subject} talking to a new employee on their first day. What do you tell them?",
]
RP_VOCAB.update({"company": [c for c, _ in SUPPORT_CASES]})


def _roleplay(rng: random.Random) -> str:
    r = rng.random()
    if r < 0.25:
        role, _ = rng.choice(ROLES)
        return fill(rng.choice(RP_TEMPLATES_GENERIC), rng, RP_VOCAB, {"role": role})
    if r < 0.5:
        role, asks = rng.choice(ROLES)
        return fill(rng.choice(RP_TEMPLATES_ASK), rng, RP_VOCAB, {"role": role, "ask": rng.choice(asks)})
    company, complaint = rng.choice(SUPPORT_CASES)
    tsubject, ttopic = rng.choice(TUTOR_CASES)
    figure, fevent = rng.choice(FIGURE_EVENTS)
    fixed = {"company": company, "complaint": complaint, "tsubject": tsubject, "ttopic": ttopic,
             "figure": figure, "fevent": fevent}
    return fill(rng.choice(RP_TEMPLATES_OTHER), rng, RP_VOCAB, fixed)


# ----------------------------------------------------------------------------------------
# reasoning
# ----------------------------------------------------------------------------------------

COMPARISONS = [("is taller than", "Who is the tallest?", "Who is the shortest?"),
               ("is older than", "Who is the oldest?", "Who is the youngest?"),
               ("runs faster than", "Who is the fastest runner?", "Who is the slowest runner?"),
               ("arrived earlier than", "Who arrived first?", "Who arrived last?"),
               ("has more books than", "Who has the most books?", "Who has the fewest books?"),
               ("scored higher than", "Who had the highest score?", "Who had the lowest score?"),
               ("lives closer to the school than", "Who lives closest to the school?", "Who lives farthest from the school?")]
WEEKDAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
ODD_GROUPS = {
    "fruits": ["apple", "banana", "mango", "cherry", "pear", "grape", "plum"],
    "vegetables": ["carrot", "broccoli", "spinach", "onion", "potato", "cabbage"],
    "mammals": ["dolphin", "horse", "bat", "elephant", "tiger", "whale"],
    "birds": ["sparrow", "penguin", "eagle", "ostrich", "parrot", "owl"],
    "planets": ["Mars", "Venus", "Jupiter", "Saturn", "Mercury", "Neptune"],
    "instruments": ["violin", "trumpet", "piano", "flute", "drum", "cello"],
    "metals": ["iron", "copper", "gold", "silver", "zinc", "aluminum"],
    "colors": ["red", "blue", "green", "yellow", "purple", "orange"],
    "countries": ["France", "Brazil", "Japan", "Kenya", "Canada", "India"],
}
SYLLOGISMS = [("cats", "mammals", "pets"), ("roses", "flowers", "red things"), ("squares", "rectangles", "shapes with equal sides"),
              ("doctors", "university graduates", "runners"), ("whales", "mammals", "animals that live in water"),
              ("novels", "books", "bestsellers"), ("sparrows", "birds", "animals that can fly"),
              ("violins", "string instruments", "old instruments"), ("engineers", "employees", "managers")]
CONDITIONALS = [("it rains", "the street gets wet", "The street is wet", "it rained"),
                ("the alarm is set", "it rings at seven o'clock", "The alarm rang at seven o'clock", "the alarm was set"),
                ("the oven is on", "the kitchen gets warm", "The kitchen is warm", "the oven is on"),
                ("the store is open", "the lights are on", "The lights are on", "the store is open"),
                ("you water the plant", "it grows", "The plant grew", "someone watered the plant"),
                ("Maya studies", "she passes the exam", "Maya passed the exam", "Maya studied"),
                ("the battery is dead", "the car will not start", "The car did not start", "the battery is dead"),
                ("a shape is a square", "it has four sides", "This shape has four sides", "the shape is a square")]
ANALOGIES = [("bird", "nest", "bee"), ("hand", "glove", "foot"), ("pen", "writer", "brush"), ("hot", "cold", "up"),
             ("puppy", "dog", "kitten"), ("book", "library", "painting"), ("teacher", "school", "doctor"),
             ("eye", "see", "ear"), ("water", "thirst", "food"), ("fish", "school", "wolf"), ("seed", "tree", "egg"),
             ("thermometer", "temperature", "clock"), ("winter", "snow", "autumn"), ("key", "lock", "password")]
DECISIONS = [("a small bakery", "investing in a delivery app", "buying a second oven"),
             ("a recent graduate", "taking a well-paid job in a big city", "taking a lower-paid job near family"),
             ("a family of four", "buying a house now", "renting for two more years"),
             ("a student", "studying computer science", "studying music"),
             ("a city council", "building a new park", "repairing old roads"),
             ("a small company", "hiring one senior engineer", "hiring two junior engineers"),
             ("a runner", "training for a marathon this year", "focusing on shorter races"),
             ("a school", "buying tablets for every student", "hiring more teachers"),
             ("a couple", "adopting a dog", "adopting a cat"),
             ("a traveler", "taking a train", "flying for a 600-kilometer trip")]
FALLACIES = ["Everyone I know likes this movie, so it must be the best movie of the year.",
             "If we allow students to use calculators, soon they will not be able to do any math at all.",
             "My grandfather smoked every day and lived to 95, so smoking can't be that bad.",
             "You can't trust his argument about climate because he is not a scientist.",
             "Either you support this plan completely, or you want the company to fail.",
             "I wore my lucky socks and we won the game, so the socks helped us win.",
             "This diet must work, because it is natural.",
             "Nobody has proven that ghosts don't exist, so they must be real.",
             "A famous actor recommends this toothpaste, so it must be the best one."]
PUZZLE_SCENES = [
    "A houseplant on a sunny windowsill starts wilting even though it is watered every day. What are the most likely explanations, and how could you tell them apart?",
    "The lights in one room of a house go out, but the rest of the house still has power. Walk through the possible causes in a logical order.",
    "A bakery sells fewer croissants every Monday but more every Saturday. Suggest reasons and explain how you would test them.",
    "A car starts fine in summer but struggles to start on cold winter mornings. Explain the likely reasons step by step.",
    "Sales of umbrellas and ice cream both rose in the same month. Does one cause the other? Reason it out.",
    "A student's grades improved after they started eating breakfast. Can we conclude that breakfast caused the improvement? Explain.",
    "A town notices more accidents at an intersection after a new shopping center opens nearby. What might explain this?",
    "You have two ropes that each take exactly one hour to burn, but they burn unevenly. How can you measure 45 minutes?",
    "You have a 3-liter jug and a 5-liter jug and unlimited water. How can you measure exactly 4 liters?",
    "There are three boxes labeled 'apples', 'oranges', and 'mixed', and every label is wrong. You may pick one fruit from one box. How can you relabel all the boxes correctly?",
    "A farmer must take a wolf, a goat, and a cabbage across a river in a boat that holds only one item at a time. How can he do it?",
    "You have eight coins, and one is slightly heavier than the others. Using a balance scale only twice, how can you find the heavy coin?",
]


def _reasoning(rng: random.Random) -> str:
    k = rng.randrange(16)
    if k == 0:  # ordering puzzle, correct by construction
        m = rng.choice([3, 4, 5])
        people = rng.sample(NAME_LIST, m)
        comp, qmax, qmin = rng.choice(COMPARISONS)
        facts = [f"{people[i]} {comp} {people[i + 1]}" for i in range(m - 1)]
        rng.shuffle(facts)
        q = rng.choice([qmax, qmin, f"Put all {m} people in order and explain your reasoning."])
        return f"{'. '.join(facts)}. {q}"
    if k == 1:
        day, d = rng.choice(WEEKDAYS), rng.randint(3, 200)
        return rng.choice([f"If today is {day}, what day of the week will it be in {d} days?",
                           f"Today is {day}. What day of the week was it {d} days ago? Explain your reasoning."])
    if k == 2:
        if rng.random() < 0.5:
            a, d = rng.randint(1, 30), rng.randint(2, 12)
            seq = [a + i * d for i in range(5)]
        else:
            a, r = rng.randint(1, 5), rng.choice([2, 3])
            seq = [a * r ** i for i in range(5)]
        return rng.choice([f"What number comes next in the sequence {', '.join(map(str, seq))}, ...? Explain the pattern.",
                           f"Find the pattern and give the next two numbers: {', '.join(map(str, seq))}."])
    if k == 3:
        g1, g2 = rng.sample(list(ODD_GROUPS), 2)
        items = rng.sample(ODD_GROUPS[g1], 3) + [rng.choice(ODD_GROUPS[g2])]
        rng.shuffle(items)
        return rng.choice([f"Which word does not belong: {', '.join(items)}? Explain why.",
                           f"Find the odd one out in this list and explain your choice: {', '.join(items)}."])
    if k == 4:
        a, b, c = rng.choice(SYLLOGISMS)
        return rng.choice([f"All {a} are {b}. Some {b} are {c}. Can we conclude that some {a} are {c}? Explain.",
                           f"If all {a} are {b}, and no {b} are {c}, what can we conclude about {a} and {c}?",
                           f"Is this argument valid? \"All {a} are {b}. Some {c} are {b}. Therefore, some {c} are {a}.\" Explain."])
    if k == 5:
        p, q, obs, concl = rng.choice(CONDITIONALS)
        return rng.choice([f"If {p}, then {q}. {obs}. Can we conclude that {concl}? Explain your reasoning.",
                           f"Consider the rule: \"If {p}, then {q}.\" Suppose we learn that it is not true that {q}. What can we conclude?"])
    if k == 6:
        a, b, c = rng.choice(ANALOGIES)
        return f"Complete the analogy and explain it: {a} is to {b} as {c} is to what?"
    if k == 7:
        who, o1, o2 = rng.choice(DECISIONS)
        return rng.choice([f"{_cap(who)} is deciding between {o1} and {o2}. What factors should they weigh? Give a recommendation.",
                           f"Reason through the trade-offs for {who} choosing between {o1} and {o2}."])
    if k == 8:
        return rng.choice(["What is wrong with this argument? ", "Identify the logical fallacy in this statement: "]) + \
            f"\"{rng.choice(FALLACIES)}\""
    if k == 9:
        return rng.choice(PUZZLE_SCENES)
    if k == 10:
        n = rng.randint(4, 30)
        return rng.choice([f"If {n} people are at a party and each person shakes hands with every other person exactly once, how many handshakes happen?",
                           f"In a tournament with {n} teams, every team plays every other team once. How many games are played?"])
    if k == 11:
        (nm, pr), b, s = rng.choice(NAMES), rng.randint(2, 6), rng.randint(1, 4)
        return f"{nm} has {b} brothers, and each brother has {s} sisters. How many sisters does {nm} have? Explain your answer." if pr == "she" else \
            (f"{nm} has {s} sisters, and each sister has {b} brothers. How many brothers does {nm} have? Explain your answer.")
    if k == 12:
        m, t = rng.randint(3, 9), rng.randint(2, 10)
        return f"If {m} machines take {t} minutes to make {m} widgets, how long would {m * 20} machines take to make {m * 20} widgets?"
    if k == 13:
        h, mnt = rng.randint(1, 12), rng.choice([0, 10, 15, 20, 30, 40, 45, 50])
        add = rng.randint(25, 600)
        return f"A clock shows {h}:{mnt:02d}. What time will it show after {add} minutes? Explain your steps."
    if k == 14:
        pool = [("a mouse", 1), ("a cat", 2), ("a dog", 3), ("a horse", 4), ("an elephant", 5), ("a blue whale", 6),
                ("an ant", 0), ("a car", 4.5), ("a bus", 5.5), ("a grain of rice", -1), ("a football", 1.5), ("a house", 7)]
        items = rng.sample(pool, 4)
        return rng.choice(["Arrange these from smallest to largest: ", "Sort these by typical size, largest first: "]) + \
            ", ".join(i for i, _ in items) + "."
    a, b, c = rng.sample(NAME_LIST, 3)
    obj = rng.choice(["broke the vase", "ate the last cookie", "left the door open", "took the umbrella", "spilled the paint"])
    return (f"One of {a}, {b}, and {c} {obj}. {a} says, \"It wasn't me.\" {b} says, \"{c} did it.\" "
            f"{c} says, \"{b} is lying.\" If exactly one of them is telling the truth, who {obj}? Explain your reasoning.")


# ----------------------------------------------------------------------------------------
# math
# ----------------------------------------------------------------------------------------

ITEMS = [("notebook", "notebooks"), ("pen", "pens"), ("apple", "apples"), ("sandwich", "sandwiches"),
         ("ticket", "tickets"), ("book", "books"), ("shirt", "shirts"), ("cupcake", "cupcakes"),
         ("plant", "plants"), ("candle", "candles"), ("mug", "mugs"), ("pencil", "pencils")]
VEHICLES = ["car", "train", "bus", "cyclist", "truck", "motorcycle", "boat"]


def _money(x: float) -> str:
    return f"${x:.2f}" if x != int(x) else f"${int(x)}"


def _math(rng: random.Random) -> str:
    k = rng.randrange(36)
    (nm, pr), (nm2, _) = rng.sample(NAMES, 2)
    pos = "her" if pr == "she" else "his"
    if k == 0:
        a, b = rng.randint(100, 9999), rng.randint(100, 9999)
        return rng.choice([f"What is {a} + {b}?", f"Calculate {a} + {b} and show your work.",
                           f"What is {max(a, b)} - {min(a, b)}?", f"Subtract {min(a, b)} from {max(a, b)}."])
    if k == 1:
        a, b = rng.randint(12, 99), rng.randint(12, 999)
        return rng.choice([f"What is {a} × {b}?", f"Multiply {a} by {b} and explain each step.", f"Compute {a} * {b}."])
    if k == 2:
        b = rng.randint(3, 25)
        a = b * rng.randint(5, 60) + rng.randint(0, b - 1)
        return f"Divide {a} by {b}. What are the quotient and the remainder?"
    if k == 3:
        p, x = rng.choice([5, 10, 12, 15, 20, 25, 30, 35, 40, 60, 75]), rng.randint(2, 90) * 10
        return rng.choice([f"What is {p}% of {x}?", f"Calculate {p} percent of {x}."])
    if k == 4:
        a = rng.randint(20, 400)
        b = a + rng.randint(-a // 2, a)
        if b == a:
            b += 10
        return f"The price of {A_(rng.choice(ITEMS)[0])} went from ${a} to ${b}. What is the percentage change?"
    if k == 5:
        item = rng.choice(["jacket", "laptop", "bicycle", "pair of boots", "sofa", "backpack", "lamp", "watch"])
        price, p = rng.randint(20, 900), rng.choice([10, 15, 20, 25, 30, 40, 50])
        return rng.choice([f"A {item} costs ${price}. It is on sale for {p}% off. What is the sale price?",
                           f"{nm} wants to buy a {item} that normally costs ${price}. The store offers a {p}% discount. How much will {pr} pay?"])
    if k == 6:
        bill, p = rng.randint(18, 240) + rng.choice([0, 0.5, 0.25, 0.75]), rng.choice([10, 15, 18, 20])
        ppl = rng.randint(2, 6)
        return rng.choice([f"A dinner bill is {_money(bill)}. If you add a tip of {p}%, what is the total?",
                           f"{ppl} friends share a dinner bill of {_money(bill)} and add {p}% for the tip. How much does each person pay?"])
    if k == 7:
        v, t = rng.choice(VEHICLES), rng.randint(2, 9)
        s = rng.randint(8, 120)
        return rng.choice([f"A {v} travels {s * t} km in {t} hours. What is its average speed?",
                           f"If a {v} moves at {s} km/h, how long does it take to cover {s * t} km?",
                           f"A {v} travels at {s} km/h for {t} hours. How far does it go?"])
    if k == 8:
        a, x = rng.randint(2, 12), rng.randint(-15, 25)
        b = rng.choice([v for v in range(-30, 41) if v])
        c = a * x + b
        sign = "+" if b >= 0 else "-"
        return rng.choice([f"Solve for x: {a}x {sign} {abs(b)} = {c}.", f"Find x if {a}x {sign} {abs(b)} = {c}. Show each step."])
    if k == 9:
        a, b, x = rng.randint(2, 9), rng.randint(1, 12), rng.randint(-5, 20)
        return f"Solve {a}(x - {b}) = {a * (x - b)} for x."
    if k == 10:
        x, y = rng.randint(-10, 30), rng.randint(-10, 30)
        a, b = rng.randint(1, 4), rng.randint(1, 4)
        return f"Solve the system of equations: x + y = {x + y} and {_co(a)}x - {_co(b)}y = {a * x - b * y}."
    if k == 11:
        w = rng.randint(2, 40)
        l = w + rng.randint(1, 30)
        return rng.choice([f"A rectangular garden is {l} meters long and {w} meters wide. What are its area and perimeter?",
                           f"A room measures {l} feet by {w} feet. How many square feet of carpet are needed to cover the floor?"])
    if k == 12:
        r = rng.randint(2, 30)
        return f"Find the area and circumference of a circle with radius {r} cm. Use π ≈ 3.14."
    if k == 13:
        a, b, _c = rng.choice([(3, 4, 5), (5, 12, 13), (8, 15, 17), (7, 24, 25)])
        m = rng.randint(1, 6)
        return f"A right triangle has legs of length {a * m} and {b * m}. How long is the hypotenuse?"
    if k == 14:
        scores = [rng.randint(55, 100) for _ in range(rng.randint(4, 7))]
        return rng.choice([f"{nm}'s test scores are {', '.join(map(str, scores))}. What is {pos} mean score?",
                           f"Find the mean and median of these numbers: {', '.join(map(str, scores))}."])
    if k == 15:
        a, b = rng.randint(1, 5), rng.randint(1, 5)
        x = a * rng.randint(1, 6)
        return f"A recipe uses flour and sugar in a ratio of {a}:{b}. If you use {x} cups of flour, how much sugar do you need?"
    if k == 16:
        return rng.choice([f"Convert {rng.randint(2, 500)} kilometers to miles.",
                           f"How many minutes are in {rng.randint(2, 30)} days?",
                           f"Convert {rng.randint(-20, 40)}°C to Fahrenheit.",
                           f"Convert {rng.randint(0, 110)}°F to Celsius.",
                           f"How many seconds are there in {rng.randint(2, 48)} hours?",
                           f"Convert {rng.randint(2, 250)} pounds to kilograms."])
    if k == 17:
        a, c = rng.randint(1, 9), rng.randint(1, 9)
        b, d = rng.randint(a + 1, 12), rng.randint(c + 1, 12)
        op = rng.choice(["+", "-", "×", "÷"])
        return f"What is {a}/{b} {op} {c}/{d}? Give the answer as a fraction in simplest form."
    if k == 18:
        P, r, t = rng.randint(5, 200) * 100, rng.choice([2, 3, 4, 5, 6, 7]), rng.randint(2, 10)
        return rng.choice([f"If you deposit ${P} at {r}% simple annual interest, how much interest will you earn after {t} years?",
                           f"{nm} invests ${P} at {r}% interest compounded annually. How much will {pr} have after {t} years?"])
    if k == 19:
        g = rng.randint(2, 15)
        a, b = g * rng.randint(2, 20), g * rng.randint(2, 20)
        return rng.choice([f"Find the greatest common divisor of {a} and {b}.",
                           f"What is the least common multiple of {a} and {b}?"])
    if k == 20:
        n = rng.randint(20, 400)
        return rng.choice([f"Is {n} a prime number? Explain how you know.", f"Find the prime factorization of {n}."])
    if k == 21:
        s = rng.randint(2, 12)
        return rng.choice([f"If you roll two fair six-sided dice, what is the probability that the sum is {s}?",
                           f"What is the probability of getting exactly {rng.randint(1, 4)} heads in {rng.randint(4, 6)} fair coin flips?"])
    if k == 22:
        r, b, g = rng.randint(1, 12), rng.randint(1, 12), rng.randint(1, 12)
        col = rng.choice(["red", "blue", "green"])
        return f"A bag contains {r} red, {b} blue, and {g} green marbles. If you draw one marble at random, what is the probability that it is {col}?"
    if k == 23:
        a, b = rng.randint(2, 10), rng.randint(2, 10)
        task = rng.choice(["paint a fence", "clean the house", "mow a lawn", "assemble a bookshelf"])
        return f"{nm} can {task} in {a} hours, and {nm2} can do it in {b} hours. How long will it take them working together?"
    if k == 24:
        young, d = rng.randint(3, 30), rng.randint(2, 30)
        return f"{nm} is {d} years older than {pos} cousin. The sum of their ages is {2 * young + d}. How old is each of them?"
    if k == 25:
        (i1, p1), (i2, p2) = rng.sample(ITEMS, 2)
        a, b = rng.randint(2, 9), rng.randint(2, 9)
        c1, c2 = rng.randint(1, 12) + rng.choice([0, 0.5, 0.25]), rng.randint(1, 12) + rng.choice([0, 0.5, 0.75])
        bill = next(v for v in (20, 50, 100, 200, 500) if v > a * c1 + b * c2)
        return (f"{nm} buys {a} {p1} at {_money(c1)} each and {b} {p2} at {_money(c2)} each. "
                f"How much does {pr} spend in total, and how much change does {pr} get from {_money(bill)}?")
    if k == 26:
        n = rng.randint(10, 500)
        return rng.choice([f"What is the sum of all integers from 1 to {n}?", f"What is the sum of the first {n} even numbers?"])
    if k == 27:
        return rng.choice([f"What is {rng.randint(2, 12)} to the power of {rng.randint(2, 5)}?",
                           f"What is the square root of {rng.randint(4, 40) ** 2}?",
                           f"Simplify 2^{rng.randint(2, 8)} × 2^{rng.randint(2, 8)}."])
    if k == 28:
        r1, r2 = rng.randint(-9, 12), rng.randint(-9, 12)
        s, p = r1 + r2, r1 * r2
        bs = f"- {_co(s)}x" if s > 0 else (f"+ {_co(-s)}x" if s < 0 else "")
        cs = f"+ {p}" if p > 0 else (f"- {-p}" if p < 0 else "")
        eq = " ".join(t for t in ["x^2", bs, cs] if t)
        return f"Solve the equation {eq} = 0."
    if k == 29:
        n = rng.randint(2, 40) * 5
        p = rng.choice([20, 40, 60, 80])
        return f"In a class of {n} students, {p}% walk to school. How many students do not walk to school?"
    if k == 30:
        w, h, wk = rng.randint(12, 45), rng.randint(10, 40), rng.randint(2, 8)
        return f"{nm} earns ${w} per hour and works {h} hours a week. How much does {pr} earn in {wk} weeks?"
    if k == 31:
        x, d = rng.randint(4, 12), rng.randint(50, 900)
        return f"A car uses {x} liters of fuel per 100 km. How much fuel does it need for a trip of {d} km?"
    if k == 32:
        x1, y1, x2, y2 = (rng.randint(-10, 10) for _ in range(4))
        if x1 == x2:
            x2 += 3
        return f"Find the slope of the line passing through ({x1}, {y1}) and ({x2}, {y2})."
    if k == 33:
        return rng.choice([f"Write {rng.randint(1000, 99999999):,} in scientific notation.",
                           f"Round {rng.randint(1000, 999999) / 1000:.3f} to one decimal place and to the nearest whole number."])
    if k == 34:
        l, w, h = rng.randint(2, 20), rng.randint(2, 20), rng.randint(2, 20)
        return rng.choice([f"What is the volume of a box that is {l} cm long, {w} cm wide, and {h} cm high?",
                           f"A cylinder has a radius of {w} cm and a height of {h} cm. What is its volume? Use π ≈ 3.14."])
    n, avg = rng.randint(3, 5), rng.randint(65, 88)
    target = avg + rng.randint(2, 6)
    return f"{nm}'s average on {n} tests is {avg}. What score does {pr} need on the next test to raise {pos} average to {target}?"


def _co(c: int) -> str:
    return "" if c == 1 else str(c)


def A_(word: str) -> str:
    return f"{_an(word)} {word}"


# ----------------------------------------------------------------------------------------
# coding
# ----------------------------------------------------------------------------------------

CODE_TASKS = [
    "check whether a string is a palindrome", "return the n-th Fibonacci number", "count the vowels in a string",
    "remove duplicates from a list while preserving order", "flatten a nested list", "merge two sorted lists into one sorted list",
    "find the second largest number in a list", "reverse the order of words in a sentence", "convert a Roman numeral to an integer",
    "check whether two strings are anagrams", "compute the factorial of a number recursively", "find the most common word in a text",
    "validate an email address with a regular expression", "group a list of words by their first letter",
    "compute the running total of a list of numbers", "split a list into chunks of size n", "transpose a matrix",
    "find all prime numbers below n using the Sieve of Eratosthenes", "capitalize the first letter of each word in a string",
    "count how many times each character appears in a string", "return the intersection of two lists",
    "perform binary search on a sorted list", "check whether the brackets in a string are balanced",
    "compute the greatest common divisor of two numbers", "convert a decimal number to binary",
    "sort a list of dictionaries by a given key", "find the longest word in a sentence", "rotate a list by k positions",
    "check whether a year is a leap year", "compute the sum of the digits of an integer",
    "generate all permutations of a string", "find the missing number in a list containing 1 to n",
    "convert a snake_case string to camelCase", "compute the median of a list of numbers",
    "return the keys of a dictionary sorted by their values", "print FizzBuzz from 1 to n",
    "compress a string like 'aaabbc' into 'a3b2c1'", "find the first non-repeating character in a string",
    "merge two dictionaries, adding the values of shared keys", "check whether a string is a valid IPv4 address",
    "compute the dot product of two vectors", "truncate a string to n characters and add an ellipsis",
    "count the words in a text file", "shuffle a list without using a built-in shuffle function",
    "find pairs of numbers in a list that add up to a target", "convert a temperature from Celsius to Fahrenheit",
    "remove all punctuation from a string", "compute the average word length in a sentence",
]
LANGS = ["Python", "Python", "Python", "JavaScript", "JavaScript", "TypeScript", "Go", "Java", "Rust", "C++", "Ruby"]
SQL_TABLES = [
    ("employees(id, name, department, salary, hire_date)",
     ["find the average salary in each department", "list the five highest-paid employees",
      "count how many employees were hired after 2020", "find departments with more than ten employees",
      "find employees who earn more than the average salary"]),
    ("orders(id, customer_id, order_date, total)",
     ["find the total sales for each month", "find the customer with the most orders",
      "list all orders above $500 placed in 2023", "compute the average order value per customer",
      "find customers who have not ordered in the last 90 days"]),
    ("products(id, name, category, price, stock)",
     ["list products that are out of stock", "find the most expensive product in each category",
      "count the products in each category", "increase the price of all products in the 'toys' category by 10%",
      "list products whose price is between $10 and $50, sorted by price"]),
    ("students(id, name, grade, score)",
     ["find the top three students by score in each grade", "compute the average score per grade",
      "list students whose score is below the class average", "count how many students are in each grade"]),
    ("books(id, title, author, year, rating)",
     ["find the highest-rated book for each author", "list books published before 1950",
      "find authors who have written more than three books", "compute the average rating per decade"]),
]
SHELL_TASKS = [
    "find all .log files larger than 10 MB in the current directory", "count the lines in every .py file in a folder",
    "rename all .jpeg files in a folder to .jpg", "show the ten largest files in a directory",
    "find which process is using port 8080", "search recursively for the word TODO in source files",
    "compress a folder into a tar.gz archive", "delete files older than 30 days in a cache folder",
    "print the 20 most frequent words in a text file", "show the disk usage of each subdirectory sorted by size",
    "replace 'foo' with 'bar' in all .txt files", "list all unique IP addresses in an access log",
    "watch a log file and print new lines as they appear", "make a backup copy of a file with today's date in its name",
    "count how many files of each extension are in a directory", "download a file and check its SHA-256 checksum",
]
CODE_PAIRS = [("a list", "a tuple", "Python"), ("== ", "is", "Python"), ("let", "const", "JavaScript"),
              ("var", "let", "JavaScript"), ("==", "===", "JavaScript"), ("INNER JOIN", "LEFT JOIN", "SQL"),
              ("WHERE", "HAVING", "SQL"), ("a process", "a thread", "operating systems"), ("git merge", "git rebase", "Git"),
              ("an interface", "an abstract class", "Java"), ("a shallow copy", "a deep copy", "Python"),
              ("append", "extend", "Python lists"), ("map", "forEach", "JavaScript"), ("a stack", "a queue", "data structures"),
              ("null", "undefined", "JavaScript"), ("an array", "a linked list", "data structures"),
              ("GET", "POST", "HTTP"), ("a compiler", "an interpreter", "programming languages")]
CODE_CONCEPTS = ["recursion", "closures", "list comprehensions", "decorators", "generators", "promises", "async/await",
                 "higher-order functions", "memoization", "exception handling", "inheritance", "dictionaries",
                 "regular expressions", "unit testing", "Big O notation", "hash tables", "binary search",
                 "variable scope", "immutability", "dependency injection", "context managers", "string formatting"]
SNIPPETS = [
    ("python", "def f(xs):\n    return [x * x for x in xs if x % 2 == 0]"),
    ("python", "def g(s):\n    return s == s[::-1]"),
    ("python", "from collections import Counter\n\ndef top(words, n=3):\n    return Counter(words).most_common(n)"),
    ("python", "def h(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a"),
    ("python", "result = {k: v for k, v in sorted(scores.items(), key=lambda kv: -kv[1])[:3]}"),
    ("javascript", "const total = items.filter(i => i.inStock).reduce((sum, i) => sum + i.price, 0);"),
    ("javascript", "function debounce(fn, ms) {\n  let t;\n  return (...args) => {\n    clearTimeout(t);\n    t = setTimeout(() => fn(...args), ms);\n  };\n}"),
    ("javascript", "const unique = [...new Set(arr)].sort((a, b) => a - b);"),
    ("sql", "SELECT department, COUNT(*) AS n\nFROM employees\nGROUP BY department\nHAVING COUNT(*) > 5\nORDER BY n DESC;"),
    ("bash", "for f in *.txt; do\n  wc -l \"$f\"\ndone | sort -n | tail -3"),
    ("python", "with open('data.txt') as f:\n    lines = [line.strip() for line in f if line.strip()]\nprint(len(lines))"),
    ("python", "def chunks(xs, n):\n    for i in range(0, len(xs), n):\n        yield xs[i:i + n]"),
]
BUGGY = [
    ("python", "def average(nums):\n    total = 0\n    for n in nums:\n        total += n\n    return total / len(nums) - 1"),
    ("python", "def find_max(xs):\n    best = 0\n    for x in xs:\n        if x > best:\n            best = x\n    return best"),
    ("python", "def add_item(item, items=[]):\n    items.append(item)\n    return items"),
    ("python", "def count_down(n):\n    while n > 0:\n        print(n)\n    print('Liftoff!')"),
    ("javascript", "for (var i = 0; i < 3; i++) {\n  setTimeout(() => console.log(i), 100);\n}"),
    ("javascript", "function isEven(n) {\n  if (n % 2 = 0) return true;\n  return false;\n}"),
    ("python", "def is_vowel(c):\n    return c in 'aeiou' or 'AEIOU'"),
    ("python", "def last(xs):\n    return xs[len(xs)]"),
]


def _coding(rng: random.Random) -> str:
    k = rng.randrange(10)
    if k <= 2:
        t, lang = rng.choice(CODE_TASKS), rng.choice(LANGS)
        return rng.choice([f"Write a {lang} function to {t}.", f"How do I {t} in {lang}?",
                           f"Show me how to {t} in {lang}, with a short example.",
                           f"Write a short {lang} function to {t}. Add a comment explaining how it works.",
                           f"Implement a function in {lang} that can {t}. Keep it simple.",
                           f"Write a Python function to {t}, and include two test cases.",
                           f"Can you write {lang} code to {t}? Explain the time complexity."])
    if k == 3:
        schema, tasks = rng.choice(SQL_TABLES)
        t = rng.choice(tasks)
        return rng.choice([f"Given a table {schema}, write a SQL query to {t}.",
                           f"I have a SQL table called {schema}. How do I write a query to {t}?",
                           f"Write a SQL query to {t}. The table is {schema}."])
    if k == 4:
        t = rng.choice(SHELL_TASKS)
        return rng.choice([f"Write a shell command to {t}.", f"What Linux command would I use to {t}?",
                           f"Write a short bash script to {t}.", f"How can I {t} from the command line?"])
    if k == 5:
        lang, code = rng.choice(SNIPPETS)
        return rng.choice([f"Explain what this code does:\n\n```{lang}\n{code}\n```",
                           f"What does the following {lang} code do? Explain it line by line.\n\n```{lang}\n{code}\n```",
                           f"Rewrite this code to make it more readable, and explain your changes:\n\n```{lang}\n{code}\n```"])
    if k == 6:
        lang, code = rng.choice(BUGGY)
        return rng.choice([f"Find the bug in this code and fix it:\n\n```{lang}\n{code}\n```",
                           f"This {lang} code doesn't work as expected. What is wrong?\n\n```{lang}\n{code}\n```"])
    if k == 7:
        a, b, ctx = rng.choice(CODE_PAIRS)
        return rng.choice([f"What is the difference between {a.strip()} and {b} in {ctx}?",
                           f"In {ctx}, when should I use {a.strip()} instead of {b}? Give a short example."])
    if k == 8:
        c, lang = rng.choice(CODE_CONCEPTS), rng.choice(["Python", "JavaScript"])
        return rng.choice([f"Explain {c} with a short {lang} example.", f"What are {c} in programming? Keep it brief."
                           if c.endswith("s") else f"What is {c} in programming? Keep it brief.",
                           f"Give me a beginner-friendly explanation of {c}, with a {lang} example."])
    t = rng.choice(CODE_TASKS)
    return rng.choice([f"Write a small Python class with a method to {t}, and show example usage.",
                       f"Write a JavaScript function to {t} and show how to call it.",
                       f"Write pseudocode to {t}, then explain the steps."])


# ----------------------------------------------------------------------------------------
# extraction
# ----------------------------------------------------------------------------------------

COMPANIES = ["Brightwave Solar", "Northfield Foods", "Kestrel Robotics", "BlueRiver Analytics", "Oakline Furniture",
             "Pinecrest Health", "Luma Textiles", "Harbor Logistics", "Summit Outdoor Gear", "Nimbus Software"]
INDUSTRIES = {"Brightwave Solar": "renewable energy", "Northfield Foods": "food processing", "Kestrel Robotics": "robotics",
              "BlueRiver Analytics": "data analytics", "Oakline Furniture": "furniture", "Pinecrest Health": "healthcare",
              "Luma Textiles": "textile", "Harbor Logistics": "shipping", "Summit Outdoor Gear": "outdoor equipment",
              "Nimbus Software": "software"}
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December"]
SURNAMES = ["Okafor", "Lindqvist", "Moreau", "Tanaka", "Alvarez", "Novak", "Chen", "Fischer", "Haddad", "Kowalski",
            "Patel", "O'Brien", "Rossi", "Nguyen", "Mensah"]


def _person(rng) -> str:
    return f"{rng.choice(NAME_LIST)} {rng.choice(SURNAMES)}"


def _date(rng) -> str:
    return f"{rng.choice(MONTHS)} {rng.randint(1, 28)}, {rng.randint(2019, 2025)}"


def _p_news(rng):
    c = rng.choice(COMPANIES)
    ceo, city = _person(rng), rng.choice(CITIES)
    rev, ch = rng.randint(12, 900), rng.randint(3, 45)
    up = rng.random() < 0.7
    s = [f"{c}, {A_(INDUSTRIES[c])} company based in {city}, announced on {_date(rng)} that its annual revenue "
         f"{'rose' if up else 'fell'} {ch}% to ${rev} million.",
         rng.choice([f"The company plans to open {rng.randint(2, 9)} new offices and hire about {rng.randint(5, 60) * 10} people next year.",
                     f"It also said it would invest ${rng.randint(2, 50)} million in a new factory in {rng.choice(CITIES)}."]),
         f"Chief executive {ceo} said the results reflected {rng.choice(['strong demand', 'a difficult market', 'new partnerships', 'higher costs'])}.",
         rng.choice([f"Analyst {_person(rng)} of {rng.choice(['Greystone Research', 'Marlow Capital', 'Atlas Partners'])} called the numbers "
                     f"\"{rng.choice(['encouraging', 'disappointing', 'better than expected'])}.\"",
                     f"Shares of the company {'rose' if up else 'dropped'} {rng.randint(1, 12)}% after the announcement."])]
    return " ".join(s), "news"


def _p_meeting(rng):
    ppl = rng.sample(NAME_LIST, 4)
    proj = rng.choice(["the website redesign", "the spring product launch", "the office move", "the customer survey",
                       "the mobile app beta", "the annual budget"])
    s = [f"Meeting notes, {_date(rng)}. Attendees: {', '.join(ppl)}.",
         f"The team discussed {proj}. {ppl[0]} reported that the project is {rng.choice(['on schedule', 'about two weeks behind', 'slightly over budget'])}.",
         f"{ppl[1]} will {rng.choice(['draft the timeline', 'contact the vendor', 'update the budget spreadsheet', 'prepare the slides'])} by {rng.choice(WEEKDAYS[:5])}.",
         f"{ppl[2]} agreed to {rng.choice(['review the designs', 'schedule user interviews', 'book the meeting room', 'write the press release'])}.",
         f"The next meeting is on {rng.choice(WEEKDAYS[:5])} at {rng.randint(9, 16)}:{rng.choice(['00', '30'])}."]
    return " ".join(s), "meeting"


def _p_recipe(rng):
    dish = rng.choice(["banana bread", "tomato soup", "vegetable curry", "pancakes", "lemon cookies", "chili",
                       "mushroom risotto", "apple crumble"])
    ings = rng.sample(["2 cups of flour", "3 ripe bananas", "1 onion", "2 cloves of garlic", "400 grams of tomatoes",
                       "1 cup of milk", "2 eggs", "100 grams of butter", "1 teaspoon of salt", "half a cup of sugar",
                       "1 can of coconut milk", "250 grams of rice", "1 lemon", "2 carrots"], 5)
    s = [f"To make {dish} for {rng.randint(2, 8)} people, you will need {', '.join(ings[:-1])}, and {ings[-1]}.",
         f"Start by preheating the oven to {rng.choice([175, 180, 190, 200])}°C, or warming a large pot over medium heat.",
         f"Combine the ingredients and cook for about {rng.randint(15, 60)} minutes, stirring {rng.choice(['occasionally', 'every five minutes', 'once halfway through'])}.",
         f"Let it rest for {rng.randint(5, 20)} minutes before serving."]
    return " ".join(s), "recipe"


def _p_job(rng):
    role = rng.choice(["Junior Data Analyst", "Senior Backend Engineer", "Marketing Coordinator", "Registered Nurse",
                       "Customer Success Manager", "Warehouse Supervisor", "UX Designer"])
    c, city = rng.choice(COMPANIES), rng.choice(CITIES)
    lo = rng.randint(35, 110)
    s = [f"{c} is hiring a {role} to join our team in {city}.",
         f"The role is {rng.choice(['full-time', 'part-time', 'a one-year contract'])} and {rng.choice(['fully on-site', 'hybrid, with two office days a week', 'fully remote'])}.",
         f"Candidates should have at least {rng.randint(1, 7)} years of experience and be comfortable with {rng.choice(['Excel and SQL', 'public speaking', 'fast-paced environments', 'Python and cloud services'])}.",
         f"The salary range is ${lo},000 to ${lo + rng.randint(10, 40)},000 per year, plus {rng.choice(['health insurance', 'a yearly bonus', '25 days of paid leave'])}.",
         f"Applications close on {_date(rng)}."]
    return " ".join(s), "job"


def _p_review(rng):
    opener = rng.choice([f"I bought this {rng.choice(['blender', 'laptop', 'tent', 'coffee maker', 'vacuum cleaner'])} last {rng.choice(MONTHS)} after reading several reviews.",
                         f"We stayed at the {rng.choice(['Harbor View Hotel', 'Maple Inn', 'Grand Plaza'])} for {rng.randint(2, 7)} nights in {rng.choice(MONTHS)}.",
                         f"We had dinner at {rng.choice(['Saffron Kitchen', 'The Green Fork', 'Blue Lantern Bistro'])} last {rng.choice(WEEKDAYS)}."])
    s = [opener,
         f"The best thing about it was {rng.choice(['the price', 'how quiet it is', 'the friendly staff', 'the build quality', 'the battery life', 'the location'])}.",
         f"However, {rng.choice(['the instructions were confusing', 'it broke after a few weeks', 'the service was slow', 'it is heavier than expected', 'the noise was hard to ignore'])}.",
         f"Overall, I would give it {rng.randint(1, 5)} out of 5 stars, and {rng.choice(['I would recommend it', 'I would not buy it again', 'I might try a different one next time'])}."]
    return " ".join(s), "review"


def _p_trip(rng):
    a, b, c = rng.sample(CITIES, 3)
    m = rng.choice(MONTHS)
    d1, d2 = rng.randint(1, 12), rng.randint(14, 27)
    s = [f"Travel plan for {_person(rng)}: fly from {a} to {b} on {m} {d1}, departing at {rng.randint(6, 11)}:{rng.choice(['05', '20', '45'])} a.m.",
         f"Stay {d2 - d1} nights at the {rng.choice(['Harbor View Hotel', 'Grand Plaza', 'Maple Inn', 'City Lodge'])} in {b}.",
         f"On {m} {d2}, take the {rng.choice(['train', 'bus', 'ferry'])} to {c} for a {rng.choice(['conference', 'family visit', 'two-day workshop'])}.",
         f"The return flight to {a} leaves on {m} {d2 + 1} at {rng.randint(1, 9)}:{rng.choice(['10', '30', '50'])} p.m. The total budget is ${rng.randint(8, 40) * 100}."]
    return " ".join(s), "trip"


def _p_study(rng):
    topic = rng.choice(["daily walking and sleep quality", "screen time and attention in teenagers",
                        "a new fertilizer and tomato yields", "remote work and employee well-being",
                        "bilingual education and reading scores", "green spaces and stress levels"])
    n = rng.randint(40, 3000)
    s = [f"A study led by Dr. {_person(rng)} at the University of {rng.choice(CITIES)} examined the link between {topic}.",
         f"Researchers followed {n} participants for {rng.randint(2, 24)} months.",
         f"The main outcome {rng.choice(['improved', 'increased', 'decreased'])} by {rng.randint(5, 40)}% in the group that received the intervention.",
         f"The authors caution that {rng.choice(['the sample was not representative', 'the effect was small', 'more research is needed', 'the study relied on self-reported data'])}.",
         f"The results were published in {rng.choice(MONTHS)} {rng.randint(2018, 2025)}."]
    return " ".join(s), "study"


def _p_email(rng):
    snd, rcp = _person(rng), rng.choice(NAME_LIST)
    s = [f"Hi {rcp},", f"I hope you're well. I'm writing about {rng.choice(['the invoice for last month', 'our workshop next week', 'the shared project folder', 'the rental agreement', 'the team offsite'])}.",
         f"Could you {rng.choice(['send me the updated figures', 'confirm the number of attendees', 'review the attached draft', 'sign and return the form'])} by {rng.choice(WEEKDAYS[:5])}, {_date(rng)}?",
         f"If it helps, I can {rng.choice(['call you on Thursday afternoon', 'meet at the office on Tuesday morning', 'extend the deadline by two days'])}.",
         f"Thanks so much, {snd}"]
    return " ".join(s), "email"


def _p_bio(rng):
    p = _person(rng)
    b = rng.randint(1900, 1950)
    field = rng.choice(["marine biologist", "architect", "jazz pianist", "mathematician", "novelist", "civil engineer"])
    s = [f"{p} was born in {rng.choice(CITIES)} in {b} and became a well-known {field}.",
         f"After studying in {rng.choice(CITIES)}, {p.split()[0]} {rng.choice(['founded a small studio', 'joined a research institute', 'began teaching at a local college'])} in {b + rng.randint(22, 30)}.",
         f"In {b + rng.randint(31, 45)}, {p.split()[0]} received {rng.choice(['a national award', 'an international prize', 'an honorary doctorate'])} for {rng.choice(['pioneering work', 'a celebrated book', 'a series of influential projects'])}.",
         f"{p.split()[0]} retired in {b + rng.randint(60, 70)} and {rng.choice(['still mentors young people', 'wrote a memoir', 'moved to the coast'])}."]
    return " ".join(s), "bio"


def _p_event(rng):
    ev = rng.choice(["Spring Jazz Night", "Community Science Fair", "Autumn Book Festival", "Charity 5K Run",
                     "Open-Air Film Screening", "Local Makers Market"])
    s = [f"Join us for the {ev} on {_date(rng)} at {rng.choice(['the City Hall courtyard', 'Riverside Park', 'the Central Library', 'the old train depot'])} in {rng.choice(CITIES)}.",
         f"Doors open at {rng.randint(4, 7)} p.m. and the event runs until {rng.randint(9, 11)} p.m.",
         f"Tickets cost ${rng.randint(5, 40)} for adults, and children under {rng.randint(6, 14)} get in free.",
         f"{rng.choice(['Food trucks and live music', 'Workshops and a raffle', 'Guest speakers and snacks'])} will be available. Contact {_person(rng)} for volunteer opportunities."]
    return " ".join(s), "event"


PASSAGES = [_p_news, _p_meeting, _p_recipe, _p_job, _p_review, _p_trip, _p_study, _p_email, _p_bio, _p_event]
EXTRACT_GENERIC = ["Summarize the text in one sentence.", "List every number mentioned in the text and what it refers to.",
                   "Extract all the names of people mentioned in the text.", "List all dates and times mentioned in the text.",
                   "Write a three-bullet summary of the key points.", "Extract the key facts from the text as a JSON object.",
                   "What is the main topic of the text? List three supporting details.",
                   "Write a short headline for this text.", "List all places mentioned in the text."]
EXTRACT_SPECIFIC = {
    "news": ["What was the company's revenue, and how much did it change?", "Return the company name, city, CEO, and revenue as JSON.",
             "Who is quoted or mentioned in the text, and what is their role?"],
    "meeting": ["List the action items and the person responsible for each.", "When is the next meeting, and who attended this one?",
                "What is the status of the project according to the notes?"],
    "recipe": ["List the ingredients with their quantities.", "Rewrite the instructions as numbered steps.",
               "How many people does the recipe serve, and how long does it take to cook?"],
    "job": ["Extract the job title, location, salary range, and required experience.", "Format the key details of this job posting as a bulleted list.",
            "What benefits are mentioned, and when do applications close?"],
    "review": ["What did the reviewer like and dislike? Give the star rating.", "Is this review positive, negative, or mixed? Explain briefly.",
               "Extract the pros and cons as two lists."],
    "trip": ["Create a table of the travel segments with date, origin, and destination.", "How many nights will the traveler spend away in total?",
             "List all the dates and times in the travel plan."],
    "study": ["What was the sample size and the main finding?", "What limitation did the authors mention?",
              "Summarize the study for a general audience in two sentences."],
    "email": ["What does the sender want, and by when?", "Write a short reply agreeing to the request.",
              "Extract the sender, the recipient, the request, and the deadline as JSON."],
    "bio": ["Create a timeline of the key events with years.", "How old was the person when they received the award?",
            "Extract the person's name, birthplace, birth year, and profession."],
    "event": ["What is the date, venue, and ticket price of the event?", "Who should people contact, and about what?",
              "Turn this announcement into a short social media post."],
}


def _extraction(rng: random.Random) -> str:
    passage, kind = rng.choice(PASSAGES)(rng)
    instr = rng.choice(EXTRACT_SPECIFIC[kind]) if rng.random() < 0.55 else rng.choice(EXTRACT_GENERIC)
    fmt = rng.randrange(4)
    if fmt == 0:
        return f"{instr}\n\nText:\n{passage}"
    if fmt == 1:
        return f"Read the passage below and complete the task.\n\n{passage}\n\nTask: {instr}"
    if fmt == 2:
        return f"{passage}\n\n{instr}"
    return f"Here is a short text:\n\"{passage}\"\n\n{instr}"


# ----------------------------------------------------------------------------------------
# stem
# ----------------------------------------------------------------------------------------

STEM_CONCEPTS = [
    ("photosynthesis", "biology"), ("natural selection", "biology"), ("DNA replication", "biology"), ("the immune system", "biology"),
    ("cellular respiration", "biology"), ("the water cycle", "earth science"), ("plate tectonics", "geology"),
    ("the greenhouse effect", "climate science"), ("Newton's third law", "physics"), ("inertia", "physics"),
    ("kinetic and potential energy", "physics"), ("friction", "physics"), ("electric current", "physics"),
    ("magnetism", "physics"), ("the Doppler effect", "physics"), ("entropy", "physics"), ("buoyancy", "physics"),
    ("refraction of light", "physics"), ("gravity", "physics"), ("nuclear fusion", "physics"),
    ("chemical bonds", "chemistry"), ("the pH scale", "chemistry"), ("catalysts", "chemistry"),
    ("oxidation and reduction", "chemistry"), ("isotopes", "chemistry"), ("the periodic table", "chemistry"),
    ("states of matter", "chemistry"), ("black holes", "astronomy"), ("the phases of the Moon", "astronomy"),
    ("the life cycle of a star", "astronomy"), ("the Big Bang theory", "astronomy"), ("binary numbers", "computer science"),
    ("machine learning", "computer science"), ("encryption", "computer science"), ("the internet's packet switching", "computer science"),
    ("algorithms", "computer science"), ("probability", "mathematics"), ("prime numbers", "mathematics"),
    ("derivatives", "calculus"), ("integrals", "calculus"), ("the Pythagorean theorem", "mathematics"),
    ("exponential growth", "mathematics"), ("statistical significance", "statistics"), ("vaccines", "medicine"),
    ("antibiotic resistance", "medicine"), ("the nervous system", "biology"), ("ecosystems", "ecology"),
    ("food chains", "ecology"), ("erosion", "geology"), ("ocean currents", "oceanography"),
    ("renewable energy", "engineering"), ("bridges and load distribution", "engineering"), ("semiconductors", "engineering"),
]
STEM_PLURAL = {"kinetic and potential energy", "chemical bonds", "catalysts", "oxidation and reduction", "isotopes",
               "states of matter", "black holes", "the phases of the Moon", "binary numbers", "algorithms", "prime numbers",
               "derivatives", "integrals", "vaccines", "ecosystems", "food chains", "ocean currents",
               "bridges and load distribution", "semiconductors"}
STEM_PAIRS = [("weather", "climate"), ("mass", "weight"), ("speed", "velocity"), ("a virus", "a bacterium"),
              ("mitosis", "meiosis"), ("an element", "a compound"), ("AC", "DC electricity"), ("heat", "temperature"),
              ("an acid", "a base"), ("a comet", "an asteroid"), ("RAM", "storage"), ("nuclear fission", "nuclear fusion"),
              ("a hypothesis", "a theory"), ("correlation", "causation"), ("genotype", "phenotype"),
              ("conduction", "convection"), ("series circuits", "parallel circuits"), ("a star", "a planet"),
              ("DNA", "RNA"), ("mean", "median")]
STEM_WHY = ["the sky is blue", "ice floats on water", "we have seasons", "leaves change color in autumn",
            "the Moon has phases", "metal feels colder than wood at the same temperature", "bread rises",
            "salt melts ice on roads", "we see lightning before we hear thunder", "the ocean is salty",
            "planes can fly", "soap removes grease", "onions make people cry", "the sun looks red at sunset",
            "hot air rises", "our ears pop on airplanes", "rainbows form", "iron rusts", "bubbles are round",
            "stars twinkle", "a spoon looks bent in a glass of water", "popcorn pops", "we need to sleep",
            "cats always seem to land on their feet", "tides happen twice a day", "the Earth has a magnetic field"]
STEM_HOW = ["a refrigerator", "a microwave oven", "GPS", "a solar panel", "a vaccine", "a battery", "a touchscreen",
            "a heat pump", "Wi-Fi", "an electric motor", "a nuclear power plant", "a wind turbine", "an MRI scanner",
            "a compass", "a camera lens", "a 3D printer", "a search engine", "a smoke detector",
            "a thermostat", "the human heart", "the human eye", "a rocket engine", "a hydroelectric dam", "an LED",
            "a pressure cooker", "a barcode scanner", "an airplane wing", "a fiber-optic cable"]
STEM_WHATIF = ["the Moon disappeared", "the Earth stopped rotating", "all the bees went extinct",
               "the speed of light were much slower", "humans could photosynthesize", "the oceans stopped circulating",
               "gravity were twice as strong", "there were no bacteria on Earth", "the Earth's axis were not tilted",
               "all the ice in Antarctica melted"]
STEM_VOCAB = {
    "audience": ["a ten-year-old", "a high school student", "a curious adult", "someone with no science background",
                 "a first-year university student", "my grandmother"],
    "why": STEM_WHY, "how": STEM_HOW, "whatif": STEM_WHATIF,
    "suffix": ["", "", "", " Keep it under 150 words.", " Use a simple analogy.", " Answer in one short paragraph.",
               " Include one real-world example."],
}
STEM_T_CONCEPT = [
    "Explain {c} in simple terms.{suffix}", "What {is} {c}, and why {is} {it} important?", "Explain {c} to {audience}.",
    "Give a short explanation of {c} with an everyday example.", "What are common misconceptions about {c}?",
    "Describe {c} in three or four sentences.", "How would you explain {c} to someone who has never studied {field}?",
    "Summarize the key ideas behind {c}.{suffix}", "Why {does} {c} matter in everyday life?",
    "Give three real-world examples of {c}.", "What is one experiment that demonstrates {c}?",
]
STEM_T_OTHER = [
    "What is the difference between {a} and {b}?{suffix}", "Compare {a} and {b} in a few sentences.",
    "Why is it that {why}?", "Explain why {why}.{suffix}", "Explain why {why}, in a way that {audience} would understand.",
    "How does {how} work?{suffix}", "Explain how {how} works, step by step.", "How does {how} work? Explain it so that {audience} could understand.",
    "What would happen if {whatif}?", "Imagine {whatif}. What would the main effects be?",
]


def _stem(rng: random.Random) -> str:
    if rng.random() < 0.45:
        c, field = rng.choice(STEM_CONCEPTS)
        pl = c in STEM_PLURAL
        fixed = {"c": c, "field": field, "is": "are" if pl else "is", "it": "they" if pl else "it", "does": "do" if pl else "does"}
        return fill(rng.choice(STEM_T_CONCEPT), rng, STEM_VOCAB, fixed)
    a, b = rng.choice(STEM_PAIRS)
    return fill(rng.choice(STEM_T_OTHER), rng, STEM_VOCAB, {"a": a, "b": b})


# ----------------------------------------------------------------------------------------
# humanities
# ----------------------------------------------------------------------------------------

H_VOCAB = {
    "event": ["the French Revolution", "the fall of the Roman Empire", "the Industrial Revolution", "the Renaissance",
              "the printing revolution", "World War I", "the Cold War", "the American Civil War", "the Meiji Restoration",
              "the Protestant Reformation", "the end of apartheid in South Africa", "the independence of India",
              "the fall of the Berlin Wall", "the Black Death", "the Crusades", "the Age of Exploration",
              "the signing of the Magna Carta", "the civil rights movement in the United States", "the Russian Revolution",
              "the Silk Road trade", "the spread of the Mongol Empire", "the Great Depression", "the Scientific Revolution",
              "the building of the Great Wall of China", "the partition of Africa in the 19th century",
              "the American Revolution", "the unification of Germany", "the Haitian Revolution", "the fall of Constantinople",
              "the Norman conquest of England", "the rise of the Islamic Golden Age", "the Cuban Missile Crisis",
              "the Spanish conquest of the Aztec Empire", "the women's suffrage movement", "the founding of the United Nations"],
    "figure": ["Socrates", "Confucius", "Julius Caesar", "Joan of Arc", "Martin Luther", "Queen Elizabeth I",
               "Napoleon Bonaparte", "Abraham Lincoln", "Mahatma Gandhi", "Nelson Mandela", "Frida Kahlo",
               "Simón Bolívar", "Mansa Musa", "Catherine the Great", "Ibn Battuta", "Rosa Parks", "Hypatia",
               "Genghis Khan", "Mary Wollstonecraft", "Akbar the Great",
               "Harriet Tubman", "Ashoka the Great", "Eleanor Roosevelt", "Suleiman the Magnificent", "Winston Churchill",
               "Sojourner Truth", "Charlemagne", "Qin Shi Huang", "Toussaint Louverture", "Empress Wu Zetian"],
    "work": ["Pride and Prejudice by Jane Austen", "1984 by George Orwell", "Hamlet by William Shakespeare",
             "Things Fall Apart by Chinua Achebe", "The Odyssey by Homer", "Don Quixote by Miguel de Cervantes",
             "Frankenstein by Mary Shelley", "To Kill a Mockingbird by Harper Lee", "The Great Gatsby by F. Scott Fitzgerald",
             "One Hundred Years of Solitude by Gabriel García Márquez", "Crime and Punishment by Fyodor Dostoevsky",
             "Jane Eyre by Charlotte Brontë", "Animal Farm by George Orwell", "The Little Prince by Antoine de Saint-Exupéry",
             "Macbeth by William Shakespeare", "Moby-Dick by Herman Melville",
             "Of Mice and Men by John Steinbeck", "The Tale of Genji by Murasaki Shikibu", "Beloved by Toni Morrison",
             "Lord of the Flies by William Golding", "The Metamorphosis by Franz Kafka", "Brave New World by Aldous Huxley",
             "Les Misérables by Victor Hugo", "The Epic of Gilgamesh"],
    "movement": ["Impressionism", "the Baroque style", "Romanticism", "Cubism", "Surrealism", "the Harlem Renaissance",
                 "Modernism in literature", "Gothic architecture", "Pop Art", "the Bauhaus movement", "Realism in painting",
                 "the Enlightenment"],
    "idea": ["utilitarianism", "existentialism", "stoicism", "the social contract", "the separation of powers",
             "supply and demand", "cultural relativism", "the rule of law", "comparative advantage",
             "the tragedy of the commons", "opportunity cost", "nationalism", "direct democracy",
             "moral relativism", "free will", "human rights", "soft power",
             "inflation", "the division of labor", "linguistic relativity", "globalization", "feudalism"],
    "thinker_view": ["Aristotle's idea of virtue", "Kant's view of morality", "John Locke's view of natural rights",
                     "Thomas Hobbes's view of human nature", "Karl Marx's idea of class struggle", "Adam Smith's invisible hand",
                     "Simone de Beauvoir's view of freedom", "Descartes's 'I think, therefore I am'",
                     "Confucius's view of family and society", "Nietzsche's idea of the Übermensch", "Hannah Arendt's banality of evil",
                     "Rousseau's idea of the general will", "Plato's allegory of the cave", "the categorical imperative in Kant's ethics",
                     "Mill's harm principle", "Laozi's idea of the Tao"],
    "period_place": ["ancient Egypt", "medieval Europe", "Tang dynasty China", "the Aztec Empire", "Victorian England",
                     "ancient Rome", "Edo-period Japan", "the Mali Empire", "colonial America", "ancient Greece",
                     "the Ottoman Empire", "the Inca Empire"],
    "landmark": ["the Parthenon", "the Taj Mahal", "Machu Picchu", "the pyramids of Giza", "Angkor Wat",
                 "the Colosseum", "Hagia Sophia", "Stonehenge", "the Forbidden City", "Great Zimbabwe"],
    "audience": ["a high school student", "a ten-year-old", "a curious adult", "someone who has never studied history"],
    "suffix": ["", "", "", " Keep it under 200 words.", " Answer in one or two paragraphs.", " Use simple language."],
}
H_TEMPLATES = [
    "What were the main causes of {event}?{suffix}", "Summarize the most important consequences of {event}.",
    "Why was {event} significant?{suffix}", "Explain {event} to {audience}.", "Describe three key turning points of {event}.",
    "How did {event} change ordinary people's lives?", "Who was {figure}, and why are they remembered today?",
    "What were the main achievements of {figure}?{suffix}", "Write a short biography of {figure}.",
    "What challenges did {figure} face, and how did they respond?", "What are the main themes of {work}?",
    "Summarize the plot of {work} in a short paragraph.", "Why is {work} still widely read today?",
    "Describe the main character of {work} and how they change over the story.", "What are the main features of {movement}?",
    "Compare {movement} and {movement#2}.", "How did {movement} influence later art or writing?",
    "Explain {idea} in simple terms.{suffix}", "What are the main arguments for and against {idea}?",
    "Give an everyday example of {idea}.", "Explain {thinker_view}.{suffix}", "How would you summarize {thinker_view} in a few sentences?",
    "What are common criticisms of {thinker_view}?", "Describe daily life for ordinary people in {period_place}.",
    "What did people eat and how did they work in {period_place}?", "How was society organized in {period_place}?",
    "What was the role of religion in {period_place}?", "Why was {landmark} built, and what does it tell us about its builders?",
    "Describe the history and significance of {landmark}.", "What is the legacy of {figure} today?",
    "What questions does {work} raise about society?", "What can we learn today from {event}?",
    "Who were the most important people involved in {event}?", "How do historians disagree about {event}?",
    "Explain {idea} to {audience}.", "What does {landmark} tell us about the culture that built it?",
    "Describe the art and culture of {period_place}.", "How would {figure} have described their own era?",
]

# ----------------------------------------------------------------------------------------
# chat
# ----------------------------------------------------------------------------------------

C_VOCAB = {
    "goal": ["get better sleep", "stop procrastinating", "save money on groceries", "drink more water during the day",
             "make new friends after moving to a new city", "stay focused while working from home", "wake up earlier",
             "reduce my screen time", "keep my apartment tidy", "read more books", "stick to a workout routine",
             "be more confident in meetings", "manage stress before exams", "cook healthier meals on a budget",
             "improve my handwriting", "remember people's names", "spend less on impulse purchases",
             "make my morning routine faster", "keep in touch with old friends", "get over a fear of public speaking"],
    "activity": ["a first job interview", "traveling with a toddler", "running in hot weather", "moving to a new apartment",
                 "hosting a dinner party", "studying for a big exam", "working night shifts", "camping for the first time",
                 "taking better photos with a phone", "starting a small vegetable garden", "learning to swim as an adult",
                 "a long flight", "giving a wedding speech", "negotiating a salary"],
    "situation": ["forgot my best friend's birthday", "accidentally sent an email to the wrong person",
                  "have two job offers and can't decide", "keep waking up at 3 in the morning", "spilled coffee on my laptop",
                  "have a noisy upstairs neighbor", "feel stuck in my current job", "lost my wallet on the bus",
                  "have too many things due this week", "got a parking ticket I think is unfair",
                  "want to ask my manager for feedback", "double-booked myself for Saturday night"],
    "meal": ["quick dinner", "healthy lunch", "simple breakfast", "vegetarian dinner", "cheap weeknight meal"],
    "ing": ["eggs", "spinach", "rice", "chickpeas", "tomatoes", "cheese", "potatoes", "chicken", "pasta", "onions",
            "mushrooms", "tofu", "beans", "bread", "zucchini", "lentils"],
    "place": ["Iceland", "Barcelona", "the mountains", "a beach town", "Tokyo", "New York", "the Scottish Highlands",
              "a lake cabin", "Morocco", "Rome"],
    "season": ["winter", "spring", "summer", "autumn"],
    "n": ["three", "four", "five", "seven", "ten"],
    "stain": ["red wine", "coffee", "grass", "ink", "grease", "tomato sauce", "chocolate"],
    "fabric": ["a white shirt", "a carpet", "jeans", "a couch cushion", "a wool sweater"],
    "chore": ["wash my bed sheets", "clean my refrigerator", "replace my toothbrush", "water a cactus",
              "change my car's oil", "clean my laptop keyboard", "replace my running shoes", "defrost my freezer"],
    "context": ["on a rainy weekend", "with friends on a tight budget", "with kids during summer break",
                "alone on a Sunday", "in a new city", "on a date that isn't dinner"],
    "genre": ["mystery", "science fiction", "fantasy", "nonfiction", "historical fiction", "self-help"],
    "book": ["The Hobbit", "Sherlock Holmes", "Dune", "Sapiens", "Little Women", "The Martian", "Harry Potter"],
    "social": ["decline a wedding invitation", "ask a friend to pay back money", "leave a conversation at a party",
               "tell a coworker they talk too loudly", "say no to extra work", "cancel plans at the last minute",
               "ask guests to take off their shoes"],
    "skill": ["a new language", "to play the piano", "to draw", "to code", "to dance", "chess", "to type faster"],
    "plant": ["monstera", "basil plant", "snake plant", "orchid", "tomato plant", "fiddle leaf fig"],
    "symptom": ["yellow leaves", "brown, crispy edges", "drooping stems", "white spots on the leaves", "stopped growing"],
    "room": ["bedroom", "living room", "home office", "small studio apartment"],
    "pet": ["cat", "dog", "rabbit", "parrot", "hamster", "guinea pig"],
    "relation": [r.replace("my ", "") for r in RELATIONS],
    "hobby": HOBBIES,
    "thing": ["email inbox", "closet", "kitchen cabinets", "digital photos", "desk", "weekly schedule"],
}
CHAT_CHOICES = ["work out in the morning or in the evening", "rent or buy a house", "pay off debt first or start saving",
                "learn Spanish or French first", "buy a laptop or a desktop for studying", "take the train or drive for a weekend trip",
                "shower in the morning or at night", "read the book or watch the movie first"]
C_VOCAB["choice"] = CHAT_CHOICES
C_VOCAB["upcoming"] = ["a job interview", "a long flight", "a big exam", "a dinner party to host", "a wedding speech to give",
                       "a salary negotiation", "a first camping trip", "a half marathon", "a move across the country"]
C_VOCAB["nervous"] = ["a job interview", "a first date", "a big exam", "a presentation at work", "a long flight",
                      "a wedding speech", "a doctor's appointment", "the first day at a new job"]
C_VOCAB["inlaws"] = ["parents", "grandparents", "best friends", "siblings", "coworkers"]
C_TEMPLATES = [
    "How can I {goal}?", "Do you have any tips to help me {goal}?", "Give me a simple weekly plan to {goal}.",
    "What are some tips for {activity}?", "I have {upcoming} coming up. Any advice?",
    "I {situation}. What should I do?", "Help! I {situation}. What are my options?",
    "What's a good gift for my {relation}, who likes {hobby}?", "Can you suggest a {meal} I can make with {ing}, {ing#2}, and {ing#3}?",
    "What should I pack for a {n}-day trip to {place} in {season}?", "How do I get {stain} out of {fabric}?",
    "Is it better to {choice}?", "How often should I {chore}?", "What are some fun things to do {context}?",
    "Can you recommend a few {genre} books for someone who enjoyed {book}?", "How do I politely {social}?",
    "What's the best way to learn {skill} as an adult?", "My {plant} has {symptom}. What might be wrong?",
    "How can I make my {room} feel cozier?", "What should I know before adopting a {pet}?",
    "How can I keep my {thing} organized?", "What's a quick, healthy breakfast I can make with {ing}?",
    "I'm bored. Can you suggest something fun to do {context}?", "How do I start getting into {hobby}?",
    "What are some good conversation starters for meeting my partner's {inlaws} for the first time?",
    "Is it normal to feel nervous before {nervous}? How can I calm down?",
]


# ----------------------------------------------------------------------------------------
# assembly
# ----------------------------------------------------------------------------------------

GENERATORS: dict[str, Callable[[random.Random], str]] = {
    "writing": _templated(W_TEMPLATES, W_VOCAB),
    "roleplay": _roleplay,
    "reasoning": _reasoning,
    "math": _math,
    "coding": _coding,
    "extraction": _extraction,
    "stem": _stem,
    "humanities": _templated(H_TEMPLATES, H_VOCAB),
    "chat": _templated(C_TEMPLATES, C_VOCAB),
}


def _quotas(n: int) -> dict[str, int]:
    tot = sum(CATEGORY_WEIGHTS.values())
    raw = {c: n * w / tot for c, w in CATEGORY_WEIGHTS.items()}
    q = {c: int(v) for c, v in raw.items()}
    for c in sorted(raw, key=lambda c: raw[c] - q[c], reverse=True)[: n - sum(q.values())]:
        q[c] += 1
    return q


def _norm(s: str) -> str:
    return " ".join(s.lower().split())


def _clean(s: str) -> str:
    lines = [re.sub(r"[ \t]+", " ", ln).rstrip() if not ln.startswith(" ") else ln.rstrip() for ln in s.strip().split("\n")]
    return _cap("\n".join(lines))


def make_prompts(n: int = 5000, seed: int = 0) -> list[dict]:
    """``n`` distinct prompts ``{"id", "category", "prompt"}``, deterministic for ``seed``,
    categories in proportion to CATEGORY_WEIGHTS, shuffled."""
    if n < 1:
        raise ValueError("n must be positive")
    seen: set[str] = set()
    out: list[dict] = []
    for ci, (cat, q) in enumerate(_quotas(n).items()):
        rng = random.Random(seed * 1_000_003 + ci)
        gen, got, tries = GENERATORS[cat], 0, 0
        while got < q:
            tries += 1
            if tries > 200 * q + 1000:
                raise RuntimeError(f"promptgen: could only make {got} distinct {cat} prompts (wanted {q})")
            p = _clean(gen(rng))
            key = _norm(p)
            if key in seen:
                continue
            seen.add(key)
            out.append({"id": f"{cat}-{got:05d}", "category": cat, "prompt": p})
            got += 1
    random.Random(seed).shuffle(out)
    return out


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    with path.open("w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps({"id": r["id"], "category": r["category"], "prompt": r["prompt"]}, ensure_ascii=False) + "\n")


def write_prompt_sets(out_dir, n: int = 5000, heldout: int = 200, seed: int = 0) -> tuple[Path, Path]:
    """Write ``train.jsonl`` (``n - heldout`` prompts) and ``heldout.jsonl`` (``heldout`` prompts,
    stratified so every category appears) under ``out_dir``; return the two paths."""
    if not 0 <= heldout < n:
        raise ValueError("need 0 <= heldout < n")
    rows = make_prompts(n, seed)
    by_cat: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        by_cat[r["category"]].append(r)
    cats = [c for c in CATEGORIES if by_cat[c]]
    want = {c: 0 for c in cats}
    if heldout:
        # proportional allocation, at least one per category when heldout allows
        base = {c: max(1 if heldout >= len(cats) else 0, heldout * len(by_cat[c]) // n) for c in cats}
        while sum(base.values()) > heldout:
            c = max(base, key=lambda c: base[c])
            base[c] -= 1
        order = sorted(cats, key=lambda c: len(by_cat[c]) - base[c] * n / heldout, reverse=True)
        i = 0
        while sum(base.values()) < heldout:
            base[order[i % len(order)]] += 1
            i += 1
        want = base
    held_ids = {r["id"] for c in cats for r in by_cat[c][: want[c]]}
    held = [r for r in rows if r["id"] in held_ids]
    train = [r for r in rows if r["id"] not in held_ids]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tp, hp = out / "train.jsonl", out / "heldout.jsonl"
    _write_jsonl(tp, train)
    _write_jsonl(hp, held)
    return tp, hp


def write_more(out_dir, name: str, n: int, seed: int = 0) -> Path:
    """Write ``out_dir/name``: the prompts of ``make_prompts(n, seed)`` that neither ``train.jsonl``
    nor ``heldout.jsonl`` of ``out_dir`` holds (compared after whitespace/case normalization)."""
    out = Path(out_dir)
    have = set()
    for f in ("train.jsonl", "heldout.jsonl"):
        path = out / f
        if not path.is_file():
            raise SystemExit(f"promptgen: {path} not found (write the base sets first, without --more)")
        have.update(_norm(json.loads(line)["prompt"]) for line in path.read_text(encoding="utf-8").splitlines() if line.strip())
    rows = [r for r in make_prompts(n, seed) if _norm(r["prompt"]) not in have]
    if not rows:
        raise SystemExit(f"promptgen: a set of {n} prompts adds nothing to {out} (ask for a larger --n)")
    path = out / name
    _write_jsonl(path, rows)
    return path


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="experiments/data/prompts")
    ap.add_argument("--n", type=int, default=5000)
    ap.add_argument("--heldout", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--more", metavar="FILE", help="write only the prompts train/heldout do not hold, to FILE in --out")
    a = ap.parse_args(argv)
    try:
        paths = [write_more(a.out, a.more, a.n, a.seed)] if a.more else list(write_prompt_sets(a.out, n=a.n, heldout=a.heldout,
                                                                                             seed=a.seed))
    except RuntimeError as e:  # the templates of a category ran out of distinct prompts
        raise SystemExit(f"{e}; ask for a smaller --n") from None
    for p in paths:
        cnt: dict[str, int] = defaultdict(int)
        for line in p.read_text(encoding="utf-8").splitlines():
            cnt[json.loads(line)["category"]] += 1
        print(f"{p}: {sum(cnt.values())} prompts  " + " ".join(f"{c}={cnt[c]}" for c in CATEGORIES))


if __name__ == "__main__":
    main()
