"""RULER's tasks (NVIDIA/RULER scripts/synthetic.yaml, scripts/data/synthetic/*.py, their constants.py): how
one sample's prompt and answers are made, and how a sample is fitted to a length.

A task is `Task`: its kind (niah, variable_tracking, common_words_extraction, freq_words_extraction, qa),
the arguments synthetic.yaml gives it, the tokens RULER keeps for the answer and its metric. `build`
makes the prompt (RULER's template with its answer prefix, the base model template) and the answers of
a sample of a given size (haystack sentences, noise lines, words or documents) from a random generator;
`fit` finds the largest size whose prompt, in the model's tokens, leaves the answer's tokens free in the
length, as RULER's binary search does. Every draw comes from the sample's own generator, so a sample
depends on (seed, task, length, sample number) alone. docs/evaluation.md, "RULER", lists the rules and
the differences from the original (the word lists, the haystack text, the sentence splitter).
"""

from __future__ import annotations

import dataclasses
import json
import random
import re
import string
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Optional

#: constants.py: the template (with the answer prefix prepare.py appends) and tokens_to_generate per kind.
TEMPLATES = {
    "niah": ("Some special magic {type_needle_v} are hidden within the following text. Make sure to memorize it. I "
             "will quiz you about the {type_needle_v} afterwards.\n{context}\nWhat are all the special magic "
             "{type_needle_v} for {query} mentioned in the provided text? The special magic {type_needle_v} for "
             "{query} mentioned in the provided text are"),
    "variable_tracking": ("Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n"
                          "{context}\nQuestion: Find all variables that are assigned the value {query} in the text "
                          "above. Answer: According to the chain(s) of variable assignment in the text above, {num_v} "
                          "variables are assigned the value {query}, they are: "),
    "common_words_extraction": ("Below is a numbered list of words. In these words, some appear more often than "
                                "others. Memorize the ones that appear most often.\n{context}\nQuestion: What are the "
                                "10 most common words in the above list? Answer: The top 10 words that appear most "
                                "often in the list are:"),
    "freq_words_extraction": ("Read the following coded text and track the frequency of each coded word. Find the "
                              "three most frequently appeared coded words. {context}\nQuestion: Do not provide any "
                              "explanation. Please ignore the dots '....'. What are the three most frequently "
                              "appeared words in the above coded text? Answer: According to the coded text above, the "
                              "three most frequently appeared words are:"),
    "qa": ("Answer the question based on the given documents. Only give me the answer and do not output any other "
           "words.\n\nThe following are given documents.\n\n{context}\n\nAnswer the question based on the given "
           "documents. Only give me the answer and do not output any other words.\n\nQuestion: {query} Answer:"),
}
TOKENS_TO_GENERATE = {"niah": 128, "variable_tracking": 30, "common_words_extraction": 120,
                      "freq_words_extraction": 50, "qa": 32}
#: scripts/eval/synthetic/constants.py: QA scores the best reference, the others every reference.
METRICS = {"niah": "all", "variable_tracking": "all", "common_words_extraction": "all",
           "freq_words_extraction": "all", "qa": "part"}
NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
NEEDLE = "One of the special magic {type_needle_v} for {key} is: {value}."
DOCUMENT = "Document {i}:\n{document}"
#: niah.py / variable_tracking.py: 40 depths from 0 to 100 %.
DEPTHS = tuple(round(100 * i / 39) for i in range(40))
#: variable_tracking.py: the in-context example fills up to this many tokens.
ICL_TOKENS = 500


@dataclasses.dataclass(frozen=True)
class Task:
    """One task of synthetic.yaml: its name, kind and arguments."""

    name: str
    kind: str
    args: tuple = ()

    @property
    def options(self) -> dict:
        return dict(self.args)

    @property
    def tokens_to_generate(self) -> int:
        return TOKENS_TO_GENERATE[self.kind]

    @property
    def metric(self) -> str:
        return METRICS[self.kind]


def _niah(name, haystack, k, v, nk=1, nv=1, nq=1) -> Task:
    return Task(name, "niah", (("type_haystack", haystack), ("type_needle_k", k), ("type_needle_v", v),
                               ("num_needle_k", nk), ("num_needle_v", nv), ("num_needle_q", nq)))


#: synthetic.yaml, in its order (the order numbers the tasks in the sample indices).
TASKS = {t.name: t for t in (
    _niah("niah_single_1", "noise", "words", "numbers"),
    _niah("niah_single_2", "essay", "words", "numbers"),
    _niah("niah_single_3", "essay", "words", "uuids"),
    _niah("niah_multikey_1", "essay", "words", "numbers", nk=4),
    _niah("niah_multikey_2", "needle", "words", "numbers"),
    _niah("niah_multikey_3", "needle", "uuids", "uuids"),
    _niah("niah_multivalue", "essay", "words", "numbers", nv=4),
    _niah("niah_multiquery", "essay", "words", "numbers", nq=4),
    Task("vt", "variable_tracking", (("num_chains", 1), ("num_hops", 4))),
    Task("cwe", "common_words_extraction", (("freq_cw", 30), ("freq_ucw", 3), ("num_cw", 10))),
    Task("fwe", "freq_words_extraction", (("alpha", 2.0),)),
    Task("qa_1", "qa", (("dataset", "squad"),)),
    Task("qa_2", "qa", (("dataset", "hotpotqa"),)),
)}
SYNTHETIC = tuple(name for name, t in TASKS.items() if t.kind != "qa")


@dataclasses.dataclass
class Sources:
    """What the tasks draw from: the vocabulary (distinct lower-case words), the essay haystack's words,
    and the QA sets read from local files ({dataset: (questions, documents)})."""

    vocabulary: list
    haystack: list
    qa: dict = dataclasses.field(default_factory=dict)


# -------------------------------------------------------------------------------------------- words
def vocabulary(text: str, least: int = 3) -> list[str]:
    """The distinct lower-case alphabetic words of ``text`` of at least ``least`` letters, sorted: the
    word list the tasks draw keys and common words from (RULER's wonderwords lists)."""
    return sorted({w.lower() for w in re.findall(r"[A-Za-z]+", text) if len(w) >= least})


def haystack_words(text: str) -> list[str]:
    """The essay haystack as RULER keeps it: the text's words, whitespace runs as one space."""
    return re.sub(r"\s+", " ", text).strip().split(" ")


def sentences(text: str) -> list[str]:
    """``text`` cut after each '.', '!' or '?' followed by white space (RULER uses nltk's sent_tokenize)."""
    return [s for s in re.split(r"(?<=[.!?])\s+", text.strip()) if s]


def _random_value(rng: random.Random, kind: str, words: Sequence[str]) -> str:
    """niah.py's generate_random: a 7-digit number, an adjective-noun pair (here two words of the
    vocabulary), or a version-4 UUID."""
    if kind == "numbers":
        return str(rng.randint(10**6, 10**7 - 1))
    if kind == "words":
        return f"{rng.choice(words)}-{rng.choice(words)}"
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


# -------------------------------------------------------------------------------------------- tasks
def niah(rng: random.Random, size: int, options: dict, sources: Sources) -> tuple[str, list[str]]:
    """niah.py's generate_input_output with ``size`` haystack words (essay) or lines (noise, needle)."""
    type_k, type_v = options["type_needle_k"], options["type_needle_v"]
    num_q, num_v = options["num_needle_q"], options["num_needle_v"]
    num_k = max(options["num_needle_k"], num_q)
    keys, values, needles = [], [], []
    for _ in range(num_k):
        keys.append(_random_value(rng, type_k, sources.vocabulary))
        value = [_random_value(rng, type_v, sources.vocabulary) for _ in range(num_v)]
        needles += [NEEDLE.format(type_needle_v=type_v, key=keys[-1], value=v) for v in value]
        values.append(value)
    rng.shuffle(needles)
    if options["type_haystack"] == "essay":
        words = sources.haystack
        words = (words * -(-size // len(words)))[:size]
        document = sentences(" ".join(words))
        cuts = [0] + sorted(int(len(document) * d / 100) for d in rng.sample(DEPTHS, len(needles))) + [len(document)]
        parts = []
        for i in range(1, len(cuts)):
            parts.append(" ".join(document[cuts[i - 1]:cuts[i]]))
            if i - 1 < len(needles):
                parts.append(needles[i - 1])
        context = " ".join(parts)
    else:
        if options["type_haystack"] == "noise":
            lines = [NOISE] * size
        else:  # needles of other keys as the haystack
            lines = [NEEDLE.format(type_needle_v=type_v, key=_random_value(rng, type_k, sources.vocabulary),
                                   value=_random_value(rng, type_v, sources.vocabulary)) for _ in range(size)]
        for at, needle in zip(sorted(rng.sample(range(size), len(needles)), reverse=True), needles):
            lines.insert(at, needle)
        context = "\n".join(lines)
    chosen = rng.sample(range(num_k), num_q)
    queries = [keys[i] for i in chosen]
    answers = [a for i in chosen for a in values[i]]
    query = ", ".join(queries[:-1]) + ", and " + queries[-1] if len(queries) > 1 else queries[0]
    template, type_v_text = TEMPLATES["niah"], type_v
    if num_q * num_v == 1:  # niah.py's singular wording, its replacements in its order
        for old, new in (("Some", "A"), ("are all", "is"), ("are", "is"), ("answers", "answer")):
            template = template.replace(old, new)
        type_v_text = type_v[:-1]
    return template.format(type_needle_v=type_v_text, context=context, query=query), answers


def _chains(rng: random.Random, num_chains: int, num_hops: int, letters: int) -> tuple[list, list]:
    """variable_tracking.py's generate_chains: distinct upper-case names of ``letters`` letters, a
    5-digit value, then each name assigned the one before."""
    names: list[str] = []
    while len(names) < (num_hops + 1) * num_chains:
        name = "".join(rng.choices(string.ascii_uppercase, k=letters))
        if name not in names:
            names.append(name)
    groups, chains = [], []
    for first in range(0, len(names), num_hops + 1):
        group = names[first:first + num_hops + 1]
        chain = [f"VAR {group[0]} = {rng.randint(10000, 99998)}"]
        chain += [f"VAR {group[j + 1]} = VAR {group[j]} " for j in range(num_hops)]
        groups.append(group)
        chains.append(chain)
    return groups, chains


def variable_tracking_text(rng: random.Random, size: int, num_chains: int, num_hops: int,
                           letters: int = 5) -> tuple[str, list[str]]:
    """variable_tracking.py's generate_input_output over a noise haystack of ``size`` lines."""
    groups, chains = _chains(rng, num_chains, num_hops, letters)
    value = chains[0][0].split("=")[-1].strip()
    lines = [NOISE] * size
    for chain in chains:
        at = sorted(rng.sample(range(len(lines)), len(chain)))
        for j, (position, assignment) in enumerate(zip(at, chain)):
            lines.insert(position + j, assignment)
    context = "\n".join(lines).replace(". \n", ".\n")
    return TEMPLATES["variable_tracking"].format(context=context, query=value, num_v=num_hops + 1), groups[0]


def common_words(rng: random.Random, size: int, options: dict, sources: Sources, length: int) -> tuple[str, list]:
    """common_words_extraction.py's generate_input_output with ``size`` distinct words: one worked example,
    then the list (below 4096 tokens RULER's shorter repeats)."""
    num_cw = options["num_cw"]
    if size > len(sources.vocabulary):
        raise ValueError(f"cwe needs {size} distinct words but the vocabulary has {len(sources.vocabulary)}")

    def example(count, common_repeats, uncommon_repeats):
        chosen = rng.sample(sources.vocabulary, count)
        common, uncommon = chosen[:num_cw], chosen[num_cw:]
        listed = common * common_repeats + uncommon * uncommon_repeats
        rng.shuffle(listed)
        return " ".join(f"{i + 1}. {w}" for i, w in enumerate(listed)), common

    short = length < 4096
    shot, shot_answer = example(20, 3, 1) if short else example(40, 10, 3)
    context, answer = example(size, 6, 1) if short else example(size, options["freq_cw"], options["freq_ucw"])
    template = TEMPLATES["common_words_extraction"]
    shot_text = template.format(context=shot, query="") + " " + " ".join(f"{i + 1}. {w}" for i, w in
                                                                          enumerate(shot_answer))
    return shot_text + "\n" + template.format(context=context, query=""), answer


def frequent_words(rng: random.Random, size: int, options: dict, budget: int) -> tuple[str, list]:
    """freq_words_extraction.py's generate_input_output with ``size`` coded words: a vocabulary of
    budget // 50 random 6-letter words, the first replaced by '...' (noise), word k repeated
    int(size k^-alpha / zeta(alpha)) times; the answer is words 2..4."""
    alpha = options["alpha"]
    count = max(4, budget // 50)
    vocab: list[str] = []
    while len(set(vocab)) < count:
        vocab.append("".join(rng.choices(string.ascii_lowercase, k=6)))
    vocab = sorted(set(vocab))
    rng.shuffle(vocab)
    vocab[0] = "..."
    zeta = sum(k ** -alpha for k in range(1, 100001)) + 100000 ** (1 - alpha) / (alpha - 1)
    coded = [w for k, w in enumerate(vocab, start=1) for _ in range(int(size * k ** -alpha / zeta))]
    rng.shuffle(coded)
    return TEMPLATES["freq_words_extraction"].format(context=" ".join(coded), query=""), vocab[1:4]


def qa(rng: random.Random, size: int, options: dict, sources: Sources, sample: int) -> tuple[str, list]:
    """qa.py's generate_input_output: question ``sample`` (cycling) with its documents among ``size``."""
    questions, documents = sources.qa[options["dataset"]]
    question = questions[sample % len(questions)]
    own, more = question["context"], question.get("more_context", [])
    if size < len(documents):
        if size - len(own) > len(more):
            others = [i for i in range(len(documents)) if i not in own + more]
            chosen = own + more + rng.sample(others, max(0, size - len(own) - len(more)))
        else:
            chosen = own + rng.sample(more, size - len(own))
        picked = [documents[i] for i in chosen]
    else:
        picked = (documents * -(-size // len(documents)))[:size]
    rng.shuffle(picked)
    context = "\n\n".join(DOCUMENT.format(i=i + 1, document=d) for i, d in enumerate(picked))
    return TEMPLATES["qa"].format(context=context, query=question["query"]), question["outputs"]


def least_size(task: Task, sources: Sources, sample: int) -> int:
    """The smallest size a sample of ``task`` can have."""
    options = task.options
    if task.kind == "niah":
        return max(options["num_needle_k"], options["num_needle_q"]) * options["num_needle_v"]
    if task.kind == "variable_tracking":  # every assignment of a chain goes between noise lines
        return options["num_hops"] + 1
    if task.kind == "common_words_extraction":
        return options["num_cw"] + 1
    if task.kind == "freq_words_extraction":
        return 1
    questions, _ = sources.qa[options["dataset"]]
    return len(questions[sample % len(questions)]["context"])


def build(task: Task, size: int, seed: str, sources: Sources, length: int, count: Callable[[str], int],
          sample: int = 0) -> tuple[str, list[str]]:
    """The prompt and answers of ``task``'s sample of ``size`` at ``length`` tokens, drawn from a generator
    seeded with ``seed``; ``count`` gives a text's length in model tokens (variable tracking's example)."""
    rng = random.Random(seed)
    options = task.options
    if task.kind == "niah":
        return niah(rng, size, options, sources)
    if task.kind == "variable_tracking":
        shot_budget = min(ICL_TOKENS, (length - task.tokens_to_generate) // 2)
        shot_seed = f"{seed} example"
        shot_size = largest_fitting(lambda s: variable_tracking_text(random.Random(shot_seed), s, options["num_chains"],
                                                                     options["num_hops"], 3)[0], count, shot_budget,
                                     options["num_hops"] + 1)
        shot, shot_answer = variable_tracking_text(random.Random(shot_seed), shot_size, options["num_chains"],
                                                   options["num_hops"], 3)
        text, answer = variable_tracking_text(rng, size, options["num_chains"], options["num_hops"])
        return shot + " " + " ".join(shot_answer) + "\n" + "\n" + text, answer
    if task.kind == "common_words_extraction":
        return common_words(rng, size, options, sources, length)
    if task.kind == "freq_words_extraction":
        return frequent_words(rng, size, options, length - task.tokens_to_generate)
    return qa(rng, size, options, sources, sample)


class TooShort(ValueError):
    """Even the smallest sample of a task does not fit its length."""


def largest_fitting(make: Callable[[int], str], count: Callable[[str], int], budget: int, least: int,
                    most: Optional[int] = None) -> int:
    """The largest size in ``least .. most`` (no upper bound for None) whose text ``make(size)`` has at most
    ``budget`` tokens: sizes double until one does not fit, then a binary search between the last that did
    and it. `TooShort` when even ``least`` does not fit."""
    def fits(size: int) -> bool:
        return (most is None or size <= most) and count(make(size)) <= budget

    if not fits(least):
        raise TooShort(f"the smallest sample does not fit in {budget} tokens; use longer lengths")
    good, over = least, 2 * least
    while fits(over):
        good, over = over, 2 * over
    while over - good > 1:
        middle = (good + over) // 2
        good, over = (middle, over) if fits(middle) else (good, middle)
    return good


def fit(task: Task, seed: str, sources: Sources, length: int, count: Callable[[str], int],
        sample: int = 0) -> tuple[str, list[str], int]:
    """The sample of ``task`` whose prompt takes at most ``length`` minus RULER's answer tokens: (prompt,
    answers, size). Common-words lists hold at most every word of the vocabulary once (RULER then draws
    from a second list; here the prompt stays shorter)."""
    budget = length - task.tokens_to_generate

    def make(size: int) -> str:
        return build(task, size, seed, sources, length, count, sample)[0]

    try:
        most = len(sources.vocabulary) if task.kind == "common_words_extraction" else None
        size = largest_fitting(make, count, budget, least_size(task, sources, sample), most)
    except TooShort:
        raise _too_short(task, length) from None
    text, answers = build(task, size, seed, sources, length, count, sample)
    return text, answers, size


def check_length(task: Task, seed: str, sources: Sources, length: int, count: Callable[[str], int],
                 sample: int = 0) -> None:
    """`fit`'s ValueError, before any sample is answered, when the smallest sample of ``task`` (drawn with
    ``seed``) leaves RULER's answer tokens no room in ``length``."""
    try:  # variable tracking's worked example may not fit by itself
        smallest = build(task, least_size(task, sources, sample), seed, sources, length, count, sample)[0]
    except TooShort:
        raise _too_short(task, length) from None
    if count(smallest) > length - task.tokens_to_generate:
        raise _too_short(task, length)


def _too_short(task: Task, length: int) -> ValueError:
    budget = length - task.tokens_to_generate
    return ValueError(f"length {length} is too short for RULER's {task.name}: its smallest prompt takes more than "
                      f"the {budget} tokens the answer's {task.tokens_to_generate} leave; use longer lengths")


# ------------------------------------------------------------------------------------------- scoring
def postprocess(prediction: str) -> str:
    """evaluate.py's postprocess_pred: stripped, control characters as newlines, stripped again."""
    return re.sub(r"[\x00-\x1f]", "\n", prediction.strip()).strip()


def score(prediction: str, answers: Sequence[str], metric: str) -> float:
    """One sample's score in 0..100: ``all`` (string_match_all) the share of the answers found in the
    prediction, ``part`` (string_match_part) 100 when any is; case-insensitive, after `postprocess`."""
    found = [answer.lower() in postprocess(prediction).lower() for answer in answers]
    return 100.0 * (sum(found) / len(found) if metric == "all" else max(found))


# --------------------------------------------------------------------------------------------- QA
def read_squad(path: Path) -> tuple[list, list]:
    """qa.py's read_squad: the answerable questions of a SQuAD v2 JSON file and its distinct paragraphs."""
    data = _json_file(path)
    try:
        documents = sorted({p["context"] for d in data["data"] for p in d["paragraphs"]})
        number = {c: i for i, c in enumerate(documents)}
        questions = []
        for d in data["data"]:
            own = [number[p["context"]] for p in d["paragraphs"]]
            for p in d["paragraphs"]:
                for q in p["qas"]:
                    if not q.get("is_impossible", False):
                        questions.append(dict(query=q["question"], outputs=[a["text"] for a in q["answers"]],
                                              context=[number[p["context"]]],
                                              more_context=[i for i in own if i != number[p["context"]]]))
    except (KeyError, TypeError) as error:
        raise ValueError(f"{path} is not a SQuAD JSON file (data / paragraphs / context, qas): missing {error}") \
            from None
    return _nonempty(path, questions, documents)


def read_hotpotqa(path: Path) -> tuple[list, list]:
    """qa.py's read_hotpotqa: the questions of a HotpotQA JSON list and its distinct "title\\nsentences" documents."""
    data = _json_file(path)
    try:
        documents = sorted({f"{t}\n{''.join(p)}" for d in data for t, p in d["context"]})
        number = {c: i for i, c in enumerate(documents)}
        questions = [dict(query=d["question"], outputs=[d["answer"]],
                          context=[number[f"{t}\n{''.join(p)}"] for t, p in d["context"]]) for d in data]
    except (KeyError, TypeError, ValueError) as error:
        raise ValueError(f"{path} is not a HotpotQA JSON file (a list of question, answer, context): {error}") \
            from None
    return _nonempty(path, questions, documents)


def _json_file(path: Path):
    path = Path(path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"QA file {path} does not exist")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except ValueError as error:
        raise ValueError(f"{path} is not valid JSON ({error})") from None


def _nonempty(path: Path, questions: list, documents: list) -> tuple[list, list]:
    if not questions:
        raise ValueError(f"{path} holds no answerable question")
    return questions, documents
