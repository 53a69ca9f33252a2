"""Conversations: one chat template, the data it renders, and the loss on the assistant's turns.

    chat:PATH.jsonl          one conversation a line, in the common form
                             {"messages": [{"role": "user", "content": "..."},
                                           {"role": "assistant", "content": "..."}, ...]}
                             (roles: system, user, assistant; at least one assistant turn)
    prompts:PATH             one prompt and its answer a line, "prompt<TAB>answer": a conversation
                             of one turn each (what learning from rewards asks and checks)
    builtin:arithmetic-chat  20,000 conversations of one to three sums asked and answered
                             ("What is 37 + 45?" -> "37 + 45 = 82"), made offline from a seed
    builtin:arithmetic-chat-3  the same of three numbers a sum, one or two turns
                             ("What is 37 + 45 + 12?" -> "37 + 45 + 12 = 94")
    builtin:arithmetic       sums written out, "37 + 45 = 82" a line: a text stream, what a
                             base model learns arithmetic from before it learns to chat
    builtin:arithmetic-balanced  the same with numbers of one digit and of two equally often

The template: each message is its role's marker, its content and the end-of-turn marker,

    <|user|>What is 37 + 45?<|end|><|assistant|>37 + 45 = 82<|end|>

the four markers (TEMPLATE_TOKENS) special tokens: added after the tokenizer's vocabulary, one
id each, never made from the text of a message (jaxgpt/tokenizers.py `WithSpecialTokens`; a
message that contains one is refused). A model trained on another vocabulary grows a row for
each when it is fine-tuned (jaxgpt/job/resume.py). A conversation is prepared as one document
(tokenized, cached, the last data.val_fraction held out, jaxgpt/data/prepared.py), and a decoder
reads it as one example after the separator:

    <SEP> <|user|> What is 37 + 45? <|end|> <|assistant|> 37 + 45 = 82 <|end|>
                                                          ^^^^^^^^^^^^^^^^^^^^
scored (data.loss_on="assistant"): each assistant turn's content and its end-of-turn token, so
the model learns to answer and to stop, and nothing of what the user writes. Examples are packed
into rows with segments and padding as text pairs are (jaxgpt/data/pairs.py); the loss is the
batch contract's weighted mean, over the whole batch whatever splits it (microbatches, cores).
Chatting gives the conversation so far and the assistant's marker, and reads until <|end|>.
"""

from __future__ import annotations

import dataclasses
import json
from functools import partial

import numpy as np

from jaxgpt.data.pairs import document_spans, numbered_lines
from jaxgpt.errors import UserError
from jaxgpt.tokenizers import WithSpecialTokens, separator_id

SYSTEM, USER, ASSISTANT, END = "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"
TEMPLATE_TOKENS = (SYSTEM, USER, ASSISTANT, END)
ROLE_MARKERS = {"system": SYSTEM, "user": USER, "assistant": ASSISTANT}


def chat_tokenizer(base) -> WithSpecialTokens:
    """`base` with the template's markers added after its vocabulary."""
    return WithSpecialTokens(base, TEMPLATE_TOKENS)


def render(messages: list[dict]) -> str:
    """The messages as the template writes them: marker, content, end-of-turn, each."""
    return "".join(f"{ROLE_MARKERS[m['role']]}{m['content']}{END}" for m in messages)


def without_markers(text: str) -> str:
    """A rendered conversation's text with the markers taken out: the characters its messages use."""
    for marker in TEMPLATE_TOKENS:
        text = text.replace(marker, "")
    return text


def check_messages(record, where: str) -> list[dict]:
    """The record's messages, or one line naming what is wrong with them and where."""
    messages = record.get("messages") if isinstance(record, dict) else None
    if not isinstance(messages, list) or not messages:
        raise UserError(f'{where}: no "messages" list; write {{"messages": [{{"role": ..., "content": ...}}]}}')
    for k, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ROLE_MARKERS:
            role = message.get("role") if isinstance(message, dict) else message
            raise UserError(f"{where}: message {k} has role {role!r}; use system, user or assistant")
        content = message.get("content")
        if not isinstance(content, str):
            raise UserError(f'{where}: message {k} has no text "content"')
        if inside := [marker for marker in TEMPLATE_TOKENS if marker in content]:
            raise UserError(
                f"{where}: message {k} contains {inside[0]}, one of the chat template's special tokens, which "
                "text may not spell; remove it from the message"
            )
    if not any(m["role"] == "assistant" for m in messages):
        raise UserError(f"{where}: no assistant message, so nothing to learn; add the answer or drop the line")
    return messages


def check_content(content: str, what: str) -> None:
    """One line where a message's text spells one of the template's markers: read as text, it
    would end a turn or start one the writer never meant."""
    if inside := [marker for marker in TEMPLATE_TOKENS if marker in content]:
        raise UserError(
            f"{what} contains {inside[0]}, one of the chat template's special tokens, which text may not spell; "
            "remove it"
        )


def read_conversations(path: str) -> list[str]:
    """The file's conversations, rendered: one document each."""
    documents = []
    for number, line in numbered_lines(path, f"chat:{path}"):
        where = f"line {number} of {path}"
        try:
            record = json.loads(line)
        except ValueError as error:
            raise UserError(f"{where} is not JSON ({error}); write one conversation a line") from None
        documents.append(render(check_messages(record, where)))
    if not documents:
        raise UserError(f'{path} holds no conversations; write one a line, {{"messages": [...]}}')
    return documents


def read_prompts(path: str) -> list[str]:
    """The file's lines "prompt<TAB>answer" (split at the last tab), rendered each as a
    conversation of one turn: the user asks the prompt, the assistant answers the answer. What
    learning from rewards reads (train.rl: the answer is the reference a reward compares with),
    and what supervised fine-tuning can learn from as it is."""
    documents = []
    for number, line in numbered_lines(path, f"prompts:{path}"):
        prompt, tab, answer = line.rpartition("\t")
        if not tab or not prompt.strip() or not answer.strip():
            raise UserError(
                f"line {number} of {path} is not a prompt and its answer; write them on one line with a tab "
                "between (prompt<TAB>answer)"
            )
        messages = [{"role": "user", "content": prompt.strip()}, {"role": "assistant", "content": answer.strip()}]
        documents.append(render(check_messages({"messages": messages}, f"line {number} of {path}")))
    if not documents:
        raise UserError(f"{path} holds no prompts; write one a line, prompt<TAB>answer")
    return documents


QUESTIONS = (
    "What is {plus}?",
    "{words}?",
    "Add {listed}.",
    "Compute {tight}",
    "what's {plus}",
)  # with two numbers: "What is 37 + 45?", "37 plus 45?", "Add 37 and 45.", "Compute 37+45", "what's 37 + 45"


def sum_line(*numbers: int) -> str:
    return f"{' + '.join(map(str, numbers))} = {sum(numbers)}"


def sum_question(template: str, numbers: list[int]) -> str:
    text = [str(n) for n in numbers]
    listed = f"{', '.join(text[:-1])} and {text[-1]}"
    return template.format(plus=" + ".join(text), words=" plus ".join(text), listed=listed, tight="+".join(text))


def arithmetic_sums(count: int = 20_000, seed: int = 0, largest: int = 99, balanced: bool = False) -> list[str]:
    """`count` sums of two numbers from 0 to `largest`, "37 + 45 = 82" each: the same list every
    time. Drawn uniformly, or with `balanced` each number's count of digits first, uniformly
    (numbers of one digit half the time where `largest` is 99, not a tenth: a sum below 20 is
    then a line in four, not one in fifty)."""
    rng = np.random.default_rng(seed)
    if not balanced:
        return [sum_line(a, b) for a, b in rng.integers(0, largest + 1, (count, 2)).tolist()]
    digits = rng.integers(1, len(str(largest)) + 1, (count, 2))
    lowest = np.where(digits == 1, 0, 10 ** (digits - 1))
    numbers = rng.integers(lowest, np.minimum(10**digits, largest + 1))
    return [sum_line(a, b) for a, b in numbers.tolist()]


def arithmetic_conversations(
    count: int = 20_000, seed: int = 1, largest: int = 99, addends: int = 2, most_turns: int = 3
) -> list[str]:
    """`count` conversations, rendered: one to `most_turns` turns, each a sum of `addends`
    numbers asked one of QUESTIONS' ways and answered written out ("37 + 45 = 82"); the same
    list every time."""
    rng = np.random.default_rng(seed)
    documents = []
    for turns in rng.integers(1, most_turns + 1, count).tolist():
        messages = []
        for numbers in rng.integers(0, largest + 1, (turns, addends)).tolist():
            question = sum_question(QUESTIONS[int(rng.integers(len(QUESTIONS)))], numbers)
            messages += [{"role": "user", "content": question}, {"role": "assistant", "content": sum_line(*numbers)}]
        documents.append(render(messages))
    return documents


BUILTIN_CONVERSATIONS = {
    "arithmetic-chat": arithmetic_conversations,
    # Three numbers a sum, the harder task of docs/lab.md section 21: the base model read sums of
    # two. One or two turns, so the longest conversation (87 tokens) fits a 128-token context.
    "arithmetic-chat-3": partial(arithmetic_conversations, seed=3, addends=3, most_turns=2),
}


# Text streams of sums written out, a base model's reading before it learns to chat.
BUILTIN_SUMS = {"arithmetic": arithmetic_sums, "arithmetic-balanced": partial(arithmetic_sums, balanced=True)}


def builtin_documents(name: str) -> list[str]:
    """A builtin stream of sums' lines or a builtin conversation set's conversations."""
    return (BUILTIN_CONVERSATIONS | BUILTIN_SUMS)[name]()


@dataclasses.dataclass(frozen=True)
class Conversations:
    """A split's conversations as token ranges of its stream (conversation i is
    tokens[starts[i]:ends[i]]), with what training scores of each."""

    tokens: np.ndarray
    starts: np.ndarray
    ends: np.ndarray
    separator: int  # read before each conversation, and the rows' padding
    markers: dict[str, int]  # each template token's id
    loss_on: str  # "assistant" or "all" (data.loss_on)
    left_out: int  # conversations too long for a row of block_size + 1 tokens

    def __len__(self) -> int:
        return len(self.starts)

    def unit(self, i: int) -> np.ndarray:
        """Conversation i as the model reads it: the separator, then its turns."""
        return np.concatenate([[self.separator], np.asarray(self.tokens[self.starts[i] : self.ends[i]], np.int64)])

    def scored(self, i: int) -> np.ndarray:
        """The weight of predicting each token of unit(i)."""
        unit = self.unit(i)
        if self.loss_on == "all":
            return (np.arange(len(unit)) >= 1).astype(np.float32)
        return assistant_tokens(unit, self.markers).astype(np.float32)

    def with_loss_on(self, loss_on: str) -> Conversations:
        return dataclasses.replace(self, loss_on=loss_on)


def assistant_tokens(ids: np.ndarray, markers: dict[str, int]) -> np.ndarray:
    """Which of `ids` the assistant wrote: the tokens after an assistant marker, up to and with
    the end-of-turn token that closes its turn (a turn runs from its marker to the next)."""
    ids = np.asarray(ids)
    role_markers = [markers[SYSTEM], markers[USER], markers[ASSISTANT]]
    is_marker = np.isin(ids, role_markers)
    index = np.arange(len(ids))
    latest = np.maximum.accumulate(np.where(is_marker, index, -1))  # the turn's marker, -1 before any
    turn_role = np.where(latest >= 0, ids[np.maximum(latest, 0)], -1)
    return (turn_role == markers[ASSISTANT]) & ~is_marker


def split_conversations(dataset, seq_len: int, loss_on: str) -> tuple[Conversations, Conversations]:
    """(training, validation) conversations of a prepared chat corpus; the training split scores
    as data.loss_on says, the validation split the assistant's turns always (what is compared)."""
    tokenizer = dataset.tokenizer
    markers = {marker: tokenizer.special_ids[marker] for marker in TEMPLATE_TOKENS}
    separator = separator_id(tokenizer)

    def conversations(tokens, starts, ends, scored: str) -> Conversations:
        fits = ends - starts + 1 <= seq_len + 1
        return Conversations(tokens, starts[fits], ends[fits], separator, markers, scored, int((~fits).sum()))

    (train_starts, train_ends), (val_starts, val_ends) = document_spans(dataset)
    return (
        conversations(dataset.train, train_starts, train_ends, loss_on),
        conversations(dataset.val, val_starts, val_ends, "assistant"),
    )


def prompt_ids(tokenizer, messages: list[dict], first: bool = True) -> list[int]:
    """What a chat model reads before answering: the messages (with the separator before them
    when they begin the conversation), then the assistant's marker."""
    start = [separator_id(tokenizer)] if first else []
    return start + tokenizer.encode(render(messages)) + [tokenizer.special_ids[ASSISTANT]]


def end_of_turn(tokenizer) -> int:
    return tokenizer.special_ids[END]
