"""Synthetic prompt sets for self-distillation of a draft head.

Builds a diverse, deterministic set of user prompts (no network, no model) across nine
categories -- writing, roleplay, reasoning, math, coding, extraction, stem, humanities and
chat -- from instruction templates with slots and slot vocabularies. Math prompts carry
generated numbers; extraction prompts carry a generated short passage. The templates and word
lists are data (experiments/data/promptgen_words.json); this file is the procedure.

    python experiments/promptgen.py --out experiments/data/prompts --n 5000 --heldout 200
    python experiments/promptgen.py --out experiments/data/prompts --n 13500 --more train-more.jsonl

The second form writes only the prompts of an ``--n`` set that ``train.jsonl`` and ``heldout.jsonl``
do not already hold (each category's prompts are a fixed stream for a seed, so a larger set extends
a smaller one): more training data, the held-out set untouched. The same seed gives the same
files, byte for byte: each list's order in the data file is part of the stream.
"""
from __future__ import annotations

import argparse
import json
import random
import re
from collections import defaultdict
from pathlib import Path
from typing import Callable

__all__ = ["CATEGORIES", "WORDS", "make_prompts", "write_prompt_sets", "write_more"]

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
# the word lists and templates (data), and the vocabularies shared between categories
# ----------------------------------------------------------------------------------------

WORDS = Path(__file__).resolve().parent / "data" / "promptgen_words.json"
_W = json.loads(WORDS.read_text(encoding="utf-8"))

NAMES = _W["shared"]["names"]  # [name, pronoun]
NAME_LIST = [n for n, _ in NAMES]
CITIES, HOBBIES, RELATIONS, WEEKDAYS = (_W["shared"][k] for k in ("cities", "hobbies", "relations", "weekdays"))

W_VOCAB = {**_W["writing"]["vocab"], "city": CITIES, "relation": RELATIONS, "hobby": HOBBIES}
W_TEMPLATES = _W["writing"]["templates"]

# ----------------------------------------------------------------------------------------
# roleplay
# ----------------------------------------------------------------------------------------

_RP = _W["roleplay"]
ROLES, SUPPORT_CASES, TUTOR_CASES, FIGURE_EVENTS = (_RP[k] for k in ("roles", "support_cases", "tutor_cases",
                                                                    "figure_events"))
RP_VOCAB = {**_RP["vocab"], "action": _RP["actions"], "city": CITIES, "job": W_VOCAB["job"],
            "company": [c for c, _ in SUPPORT_CASES]}
RP_TEMPLATES_GENERIC, RP_TEMPLATES_ASK, RP_TEMPLATES_OTHER = (_RP[k] for k in ("templates_generic", "templates_ask",
                                                                                "templates_other"))


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

_RS = _W["reasoning"]
COMPARISONS, ODD_GROUPS, SYLLOGISMS, CONDITIONALS, ANALOGIES, DECISIONS, FALLACIES, PUZZLE_SCENES = (
    _RS[k] for k in ("comparisons", "odd_groups", "syllogisms", "conditionals", "analogies", "decisions", "fallacies",
                     "puzzle_scenes"))


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

ITEMS, VEHICLES = _W["math"]["items"], _W["math"]["vehicles"]  # items: [singular, plural]


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

_CD = _W["coding"]
CODE_TASKS, LANGS, SQL_TABLES, SHELL_TASKS, CODE_PAIRS, CODE_CONCEPTS, SNIPPETS, BUGGY = (
    _CD[k] for k in ("tasks", "langs", "sql_tables", "shell_tasks", "pairs", "concepts", "snippets", "buggy"))


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

_EX = _W["extraction"]
COMPANIES, INDUSTRIES, MONTHS, SURNAMES = (_EX[k] for k in ("companies", "industries", "months", "surnames"))
EXTRACT_GENERIC, EXTRACT_SPECIFIC = _EX["generic"], _EX["specific"]


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

_ST = _W["stem"]
STEM_CONCEPTS, STEM_PAIRS, STEM_VOCAB = _ST["concepts"], _ST["pairs"], _ST["vocab"]
STEM_PLURAL = set(_ST["plural"])
STEM_T_CONCEPT, STEM_T_OTHER = _ST["templates_concept"], _ST["templates_other"]


def _stem(rng: random.Random) -> str:
    if rng.random() < 0.45:
        c, field = rng.choice(STEM_CONCEPTS)
        pl = c in STEM_PLURAL
        fixed = {"c": c, "field": field, "is": "are" if pl else "is", "it": "they" if pl else "it", "does": "do" if pl else "does"}
        return fill(rng.choice(STEM_T_CONCEPT), rng, STEM_VOCAB, fixed)
    a, b = rng.choice(STEM_PAIRS)
    return fill(rng.choice(STEM_T_OTHER), rng, STEM_VOCAB, {"a": a, "b": b})


# ----------------------------------------------------------------------------------------
# humanities and chat: templates over vocabularies only
# ----------------------------------------------------------------------------------------

H_VOCAB, H_TEMPLATES = _W["humanities"]["vocab"], _W["humanities"]["templates"]
C_VOCAB = {**_W["chat"]["vocab"], "relation": [r.replace("my ", "") for r in RELATIONS], "hobby": HOBBIES}
C_TEMPLATES = _W["chat"]["templates"]


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
