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

    def apply_chat(self, messages: list[dict], assistant_prefix: str = "", generation_prompt: bool = True) -> list[int]:
        """Chat-template the messages with the generation prompt (the opening of the assistant's
        turn; off: the messages alone), then append assistant_prefix."""
        if not self.hf.chat_template:
            raise ValueError("this tokenizer has no chat template; pass a raw prompt instead")
        text = self.hf.apply_chat_template(messages, add_generation_prompt=generation_prompt, tokenize=False)
        return list(self.hf.encode(text + assistant_prefix, add_special_tokens=False))

    def fingerprint(self) -> str:
        """SHA-256 over the token list (id -> string), so two tokenizers compare by content."""
        vocab = sorted(self.hf.get_vocab().items(), key=lambda kv: kv[1])
        h = hashlib.sha256()
        for tok, i in vocab:
            h.update(f"{i}\t{tok}\n".encode())
        return h.hexdigest()
