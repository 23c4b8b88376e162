"""A run's dataset: its prompts and documents as rows, whoever produced them (pure, no I/O).

Rows come from `rl.prompts.v1` and `rl.corpus.v1` (the live loop) or from files; the ones that
carry the run's dataset name are its data. A prompt row's `split` says train or heldout; a row
without one is carved by its prompt_id (`heldout_frac`), the same way in every run. Held-out
prompts are evaluated on and never trained on or pre-trained on.

Admission: a prompt the run cannot train on (its task names no verifier, its answer does not
parse, its text has characters outside the tokenizer's alphabet or does not fit the context) is
refused with the reason, at publish time or by the scheduler (to the dead-letter topic), never by
an exception inside a worker.

The built-in generators are one producer of such rows (`generated_prompt_rows`,
`generated_corpus_rows`): `rlstream run` without data.prompts writes them to files and publishes
them like a user's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from rlstream.schemas import RowError, make_event_id, prepare_row
from rlstream.trainers.envs import TASKS, Prompt, TaskMix, get_task, sample_prompts, split_of
from rlstream.trainers.envs.code import reference_solution
from rlstream.trainers.envs.cot import in_format
from rlstream.trainers.tokens import EOS

if TYPE_CHECKING:  # the tokenizer brings torch: `rlstream publish` checks rows without it
    from rlstream.trainers.lm import Tokenizer

HELDOUT_SALT = 0  # split_of seed for carving user datasets: independent of the run's seed


def prompt_of_row(row: dict) -> Prompt:
    """The Prompt a prompts (or rollout_requests) row describes; without an environment column
    its task family's environment, if it has one; without an answer, a code row's reference
    solution (MBPP's `code`, HumanEval's `canonical_solution`) is its answer."""
    return Prompt(
        row["prompt_id"],
        row["text"],
        row["task"],
        row.get("difficulty") or 0,
        row.get("answer") or _reference(row),
        row.get("verifier") or "",
        row.get("metadata") or "",
        row.get("environment") or getattr(TASKS.get(row["task"]), "environment", ""),
    )


def _reference(row: dict) -> str:
    code = "code" in (row.get("task"), row.get("verifier"))
    return reference_solution(row.get("metadata")) if code else ""


def split_of_row(row: dict, heldout_frac: float) -> str:
    """'train' or 'heldout': the row's split column, else carved from its prompt_id."""
    split = row.get("split")
    if split in ("train", "heldout"):
        return split
    return split_of(row["prompt_id"], HELDOUT_SALT, heldout_frac)


def prompt_problem(row: dict, tok: Tokenizer, max_prompt_tokens: int) -> str | None:
    """Why the run cannot train on this prompt row, or None if it can."""
    return verifier_problem(row) or text_problem(row["text"], tok, max_prompt_tokens)


def verifier_problem(row: dict) -> str | None:
    """Why no verifier can check this prompt row (its task names none, or the verifier cannot
    read its answer; or it names an environment there is none of), or None. Needs no model, so
    `rlstream publish` checks it too."""
    from rlstream.trainers.environments.base import environment_class

    if env := row.get("environment"):
        try:
            environment_class(env)
        except ValueError as exc:
            return str(exc)
    name = row.get("verifier") or row["task"]
    what = "verifier" if row.get("verifier") else "task"
    try:
        family = get_task(name)
    except KeyError:
        known = ", ".join(sorted(TASKS))
        return f"{what} {name!r} names no verifier (known: {known}, rg:<dataset>)"
    check = getattr(family, "answer_problem", None)
    problem = check(row.get("answer") or "") if check else None
    if problem is None and hasattr(family, "row_problem"):  # code: its tests must parse
        problem = family.row_problem(row)
    return f"{what} {name!r}: {problem}" if problem else None


def text_problem(text: str, tok: Tokenizer, max_tokens: int) -> str | None:
    """Why the tokenizer or the context cannot take this text, or None. The end-of-sequence
    text (a newline for the char tokenizer) would end a prompt early: refused too."""
    unknown = tok.unknown(text) + ([tok.eos] if tok.eos in text else [])
    if unknown:
        shown = "".join(sorted(unknown)[:8])
        alphabet = " (printable ASCII, no newline)" if tok.is_char else ""
        return f"characters {shown!r} are not in the model's alphabet{alphabet}"
    if max_tokens < 10**9:
        seen = tok.format_prompt(text)  # what the model reads: with the chat template, if any
        n, unit = (len(seen), "characters") if tok.is_char else (len(tok.encode(seen)), "tokens")
        if n > max_tokens:
            return f"text is {n} {unit}; the context leaves room for {max_tokens}"
    return None


@dataclass
class DatasetView:
    """The dataset's rows seen so far: the train pool, the held-out prompts and the documents.

    Prompts collapse by event id (re-publishing a row does not duplicate it; a generator's
    repeated draws carry distinct ids, so its pool keeps their frequencies); the held-out set
    collapses by prompt_id.
    """

    name: str
    heldout_frac: float = 0.2
    pool: dict[str, Prompt] = field(default_factory=dict)
    heldout: dict[str, Prompt] = field(default_factory=dict)
    docs: dict[tuple[bool, str], str] = field(default_factory=dict)
    validation: dict[str, str] = field(default_factory=dict)
    _events_of: dict[str, set[str]] = field(default_factory=dict, repr=False)

    def ours(self, row: dict) -> bool:
        return row.get("dataset") == self.name

    def add_prompt(self, row: dict) -> str | None:
        """File a prompt row; returns its split ('train'/'heldout'), None if not ours. A prompt
        once held out stays out of the pool, whatever later rows say."""
        if not self.ours(row):
            return None
        split = split_of_row(row, self.heldout_frac)
        prompt = prompt_of_row(row)
        if split == "heldout":
            for event_id in self._events_of.pop(prompt.prompt_id, ()):
                del self.pool[event_id]
            self.heldout[prompt.prompt_id] = prompt
        elif prompt.prompt_id in self.heldout:
            return "heldout"
        else:
            self.pool[row["event_id"]] = prompt
            self._events_of.setdefault(prompt.prompt_id, set()).add(row["event_id"])
        return split

    def add_doc(self, row: dict) -> bool:
        """File a document row (generated documents sort first, then by doc_id)."""
        if not self.ours(row):
            return False
        if row.get("split") == "validation":
            self.validation[row["doc_id"]] = row["text"]
        else:
            self.docs[(row.get("source") != "generator", row["doc_id"])] = row["text"]
        return True

    def eval_set(self, n: int) -> list[Prompt]:
        """Up to n held-out prompts, in a fixed order (by prompt_id)."""
        return [self.heldout[k] for k in sorted(self.heldout)][:n]

    def corpus(self) -> tuple[list[str], list[str]]:
        """(training documents, validation documents). A dataset without documents pre-trains
        on its train prompts written out with their answers, validated on the held-out ones."""
        if self.docs:
            docs = [self.docs[k] for k in sorted(self.docs)]
            val = [self.validation[k] for k in sorted(self.validation)]
            return docs, val or docs[: max(1, len(docs) // 50)]
        train = sorted({p.prompt_id: p for p in self.pool.values()}.values(), key=_by_id)
        held = sorted(self.heldout.values(), key=_by_id)
        docs = [p.text + p.answer + EOS for p in train if p.answer]
        val = [p.text + p.answer + EOS for p in held if p.answer]
        return docs, val or docs[: max(1, len(docs) // 50)]


def _by_id(p: Prompt) -> str:
    return p.prompt_id


@dataclass
class Usable:
    """What of a dataset the model can take, and how much of the rest was left out."""

    pool: list[Prompt]
    eval_set: list[Prompt]
    docs: list[str]
    validation: list[str]
    refused: dict[str, int]


def usable(view: DatasetView, cfg, tok: Tokenizer) -> Usable:
    """The train pool, up to eval.prompts held-out prompts, and the documents the tokenizer
    can write (a newline inside one is a document of turns, not an early end) and the context
    can take (cfg: a Config). A dataset with nothing usable on a side raises
    ValueError naming it."""
    room = cfg.model.block_size - cfg.rl.max_new_tokens
    pool = [p for p in view.pool.values() if not prompt_problem(p.to_row(), tok, room)]
    held = view.eval_set(len(view.heldout))
    admitted = [p for p in held if not prompt_problem(p.to_row(), tok, room)]
    docs, val = view.corpus()
    fits = [d for d in docs if not tok.unknown(d.removesuffix(EOS))]
    val_fits = [d for d in val if not tok.unknown(d.removesuffix(EOS))]
    refused = {
        "train_prompts": len(view.pool) - len(pool),
        "heldout_prompts": len(held) - len(admitted),
        "documents": len(docs) - len(fits) + len(val) - len(val_fits),
    }
    for side, rows in (("train prompts", pool), ("held-out prompts", admitted),
                       ("documents", fits), ("validation documents", val_fits)):  # fmt: skip
        if not rows:
            raise ValueError(f"dataset {view.name!r}: no {side} the model can take ({refused})")
    return Usable(pool, admitted[: cfg.eval.prompts], fits, val_fits, refused)


def dataset_name(cfg) -> str:
    """data.dataset, or from data.prompts (a file's stem, topic:NAME's NAME), or
    generated-<run_id> for the generated data."""
    if cfg.data.dataset:
        return cfg.data.dataset
    source = cfg.data.prompts
    if source is None:
        return f"generated-{cfg.run_id}"
    return source.removeprefix("topic:") if source.startswith("topic:") else Path(source).stem


def file_rows(
    path: str, event, dataset: str, problem=None
) -> tuple[list[dict], list[tuple[str, str]]]:
    """A file's rows as `event` rows of `dataset`, and its bad rows (where, reason);
    `problem(row)` may refuse a well-formed row with a reason."""
    from rlstream.connectors.files import read_rows

    rows, bad = [], []
    for row in read_rows(Path(path)):
        if row.error is not None:
            bad.append((row.where, row.error))
            continue
        try:
            prepared = prepare_row(event, row.data, dataset)
        except RowError as exc:
            bad.append((row.where, str(exc)))
            continue
        reason = problem(prepared) if problem else None
        if reason:
            bad.append((row.where, reason))
        else:
            rows.append(prepared)
    return rows, bad


def local_view(cfg) -> tuple[DatasetView, dict[str, list]]:
    """The in-process loop's dataset: the data.prompts / data.corpus files, else the generated
    rows (the same rows `rlstream run` publishes), and the files' bad rows."""
    from rlstream.schemas import get

    name, view, bad = dataset_name(cfg), DatasetView(dataset_name(cfg), cfg.data.heldout_frac), {}
    from rlstream.trainers.lm import load_tokenizer

    tok, room = load_tokenizer(cfg.model), cfg.model.block_size - cfg.rl.max_new_tokens
    if cfg.data.prompts is None:
        prompts = generated_prompt_rows(cfg, name)
    else:
        prompts, bad[cfg.data.prompts] = file_rows(
            cfg.data.prompts, get("prompts"), name, lambda row: prompt_problem(row, tok, room)
        )
    if cfg.data.corpus is not None:
        docs, bad[cfg.data.corpus] = file_rows(cfg.data.corpus, get("corpus"), name)
    else:
        docs = generated_corpus_rows(cfg, name) if cfg.data.prompts is None else []
    for row in prompts:
        view.add_prompt(row)
    for row in docs:
        view.add_doc(row)
    return view, {source: rows for source, rows in bad.items() if rows}


def train_texts(cfg) -> list[str]:
    """What a trained tokenizer learns from: the run's train prompts with their answers and its
    pre-training documents (data.prompts / data.corpus files, else the generated rows), never
    a held-out prompt or a validation document."""
    from rlstream.config import ConfigError
    from rlstream.schemas import get

    name = dataset_name(cfg)
    for source in (cfg.data.prompts, cfg.data.corpus):
        if source is not None and source.startswith("topic:"):
            raise ConfigError(
                f"model.tokenizer: {cfg.model.tokenizer} is trained on the run's data files; "
                f"with {source} give a tokenizer directory (model.tokenizer=DIR)"
            )
    if cfg.data.prompts is None:
        prompts = generated_prompt_rows(cfg, name)
    else:
        prompts, _ = file_rows(cfg.data.prompts, get("prompts"), name)
    if cfg.data.corpus is not None:
        docs, _ = file_rows(cfg.data.corpus, get("corpus"), name)
    else:
        docs = generated_corpus_rows(cfg, name) if cfg.data.prompts is None else []
    texts = [
        r["text"] + (r.get("answer") or "") + EOS
        for r in prompts
        if split_of_row(r, cfg.data.heldout_frac) == "train"
    ]
    return texts + [r["text"] for r in docs if r.get("split") != "validation"]


def with_tokenizer(cfg, directory: Path):
    """`cfg` as it is, unless model.tokenizer is bpe:N: then a BPE trained on the run's data
    (`train_texts`) is saved in `directory` and the config names that directory, so every
    process of the run, and a resumed run, loads the same tokenizer."""
    from dataclasses import replace

    from rlstream.config.modelpath import parse_tokenizer, resolve_path

    kind, size = parse_tokenizer(cfg.model.tokenizer, resolve_path(cfg.model.path)[0])
    if kind != "bpe":
        return cfg
    from rlstream.trainers.lm import Tokenizer

    Tokenizer.bpe(train_texts(cfg), size).save(directory)
    return replace(cfg, model=replace(cfg.model, tokenizer=str(Path(directory).resolve())))


def generated_prompt_rows(cfg, dataset: str) -> list[dict]:
    """The generated pool (data.pool_size train draws, repeats kept as distinct events) and the
    held-out evaluation prompts (eval.prompts), as prompt rows of `dataset`."""
    mix = TaskMix.parse(cfg.data.tasks)
    pool = sample_prompts(mix, cfg.data.pool_size, "train", cfg.seed, unique=False)
    heldout = sample_prompts(mix, cfg.eval.prompts, "heldout", cfg.seed, strict=False)
    pool, heldout = ([in_format(p, cfg.data.format) for p in ps] for ps in (pool, heldout))
    rows = [
        p.to_row()
        | {"split": "train", "dataset": dataset, "event_id": make_event_id("pool", dataset, i)}
        for i, p in enumerate(pool)
    ]
    rows += [
        p.to_row()
        | {
            "split": "heldout",
            "dataset": dataset,
            "event_id": make_event_id("heldout", dataset, p.prompt_id),
        }
        for p in heldout
    ]
    return rows


def generated_corpus_rows(cfg, dataset: str) -> list[dict]:
    """The generated pre-training documents (train split only) and the plateau detector's
    validation documents, as corpus rows of `dataset`."""
    from rlstream.trainers.pretrain import VAL_DOCS, build_corpus

    mix = TaskMix.parse(cfg.data.tasks)
    fmt = cfg.data.format
    docs = build_corpus(mix, cfg.data.corpus_docs, cfg.data.flaw_rate, cfg.seed, cfg.seed, fmt)
    val = build_corpus(mix, VAL_DOCS, cfg.data.flaw_rate, cfg.seed + 1, cfg.seed, fmt)
    rows = [
        {"doc_id": f"{dataset}-doc-{i:08d}", "text": d, "source": "generator", "split": "train"}
        for i, d in enumerate(docs)
    ]
    rows += [
        {
            "doc_id": f"{dataset}-val-{i:08d}",
            "text": d,
            "source": "generator",
            "split": "validation",
        }
        for i, d in enumerate(val)
    ]
    return [r | {"dataset": dataset} for r in rows]
