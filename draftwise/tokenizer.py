"""A thin tokenizer wrapper: encode, decode, chat template, EOS set, token-list fingerprint."""
from __future__ import annotations

import hashlib


class Tokenizer:
    def __init__(self, hf_tokenizer, eos_token_ids: set[int] | None = None):
        self.hf = hf_tokenizer
        eos = set(eos_token_ids or ())
        if hf_tokenizer.eos_token_id is not None:
            eos.add(int(hf_tokenizer.eos_token_id))
        self.eos_token_ids = frozenset(eos)

    def __len__(self) -> int:
        return len(self.hf)

    def encode(self, text: str) -> list[int]:
        return list(self.hf.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int]) -> str:
        return self.hf.decode(ids, skip_special_tokens=True)

    def apply_chat(self, messages: list[dict], assistant_prefix: str = "", generation_prompt: bool = True,
                   tools: list[dict] | None = None) -> list[int]:
        """Chat-template the messages with the generation prompt (the opening of the assistant's
        turn; off: the messages alone), then append assistant_prefix; `tools`: OpenAI's function
        specs, which the template renders (into the system prompt, for Qwen2.5's)."""
        if not self.hf.chat_template:
            raise ValueError("this tokenizer has no chat template; pass a raw prompt instead")
        text = self.hf.apply_chat_template(messages, tools=tools or None, add_generation_prompt=generation_prompt,
                                          tokenize=False)
        return list(self.hf.encode(text + assistant_prefix, add_special_tokens=False))

    def tool_call_tokens(self) -> tuple[int, int] | None:
        """The ids of the chat template's tool-call tags (<tool_call>, </tool_call>: Qwen2.5's and
        Hermes's format, each one token), or None when the template calls tools no such way."""
        tags = ("<tool_call>", "</tool_call>")
        ids = self.hf.convert_tokens_to_ids(list(tags))
        if tags[0] not in (self.hf.chat_template or "") or any(i is None or i == self.hf.unk_token_id for i in ids):
            return None
        return int(ids[0]), int(ids[1])

    def fingerprint(self) -> str:
        """SHA-256 over the token list (id -> string), so two tokenizers compare by content."""
        vocab = sorted(self.hf.get_vocab().items(), key=lambda kv: kv[1])
        h = hashlib.sha256()
        for tok, i in vocab:
            h.update(f"{i}\t{tok}\n".encode())
        return h.hexdigest()
