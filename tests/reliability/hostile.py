"""The hostile inputs of issue 12 and their relatives: values the schema admits but the
engine might not, wrong types, limits, malformed JSON and malformed HTTP. Each case says
which statuses are right: a 4xx, or 200 where the input is valid and must be handled
safely. Every answer >= 400 must be in the documented error shape."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
EMBEDDINGS = "/v1/embeddings"
RERANK_PATHS = ("/v1/rerank", "/v2/rerank", "/rerank")
CLIENT_ERROR = frozenset(range(400, 500))
SAFE = CLIENT_ERROR | {200}  # a valid but extreme value: rejected clearly or handled


@dataclass(frozen=True)
class Hostile:
    name: str
    path: str
    body: bytes = b""
    method: str = "POST"
    headers: dict[str, str] = field(default_factory=dict)
    allowed: frozenset[int] = CLIENT_ERROR
    # Sent as is on a socket: malformed HTTP, which HAProxy's parser refuses before any
    # request exists. HAProxy 2.8 (the one Ray bundles) answers those with its built-in
    # HTML 400, not an errorfile (docs/operations.md, "The front door"): the status is
    # checked, the shape only reported.
    raw: bytes | None = None

    @property
    def is_generation(self) -> bool:
        return self.path in (CHAT, COMPLETIONS)


def _json(value: object) -> bytes:
    # allow_nan: JSON has no NaN, but Python's and many clients' encoders write one.
    return json.dumps(value, allow_nan=True).encode()


def _chat(llm: str, **fields: object) -> dict:
    return {
        "model": llm,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 8,
        **fields,
    }


def generation_cases(llm: str) -> list[Hostile]:
    cases: list[Hostile] = []
    # Values the schema admits that once stopped the engine for every client.
    for name, value in {
        "temperature": [1e-39, 5e-324, 1e-45, 1e-30, 2.0],
        "top_p": [1e-300, 1e-45, 5e-324, 1e-38],
        "seed": [2**64, 2**63, -1, -(2**63) - 1, 2**200],
    }.items():
        for v in value:
            cases.append(
                Hostile(f"chat {name}={v!r}", CHAT, _json(_chat(llm, **{name: v})), allowed=SAFE)
            )
            body = {"model": llm, "prompt": "hi", "max_tokens": 8, name: v}
            cases.append(
                Hostile(f"completion {name}={v!r}", COMPLETIONS, _json(body), allowed=SAFE)
            )
    both = _chat(llm, temperature=1e-39, top_p=1e-300)
    cases.append(Hostile("chat temperature and top_p tiny", CHAT, _json(both), allowed=SAFE))
    for prompt in ["", " ", "\n\t ", [""], ["   "]]:
        body = {"model": llm, "prompt": prompt, "max_tokens": 8}
        cases.append(
            Hostile(f"completion prompt={prompt!r}", COMPLETIONS, _json(body), allowed=SAFE)
        )
    for content in ["", " ", []]:
        body = {"model": llm, "messages": [{"role": "user", "content": content}], "max_tokens": 8}
        cases.append(Hostile(f"chat content={content!r}", CHAT, _json(body), allowed=SAFE))
    # Wrong types and out-of-range values: always a 400.
    for name, values in {
        "max_tokens": ["5", True, 5.5, 1e30, 2**64, 0, -1, [5]],
        "temperature": ["0.5", True, float("nan"), float("inf"), -float("inf"), -1, 3, None],
        "top_p": ["1", False, float("nan"), 0, -0.5, 1.5],
        "seed": ["7", True, 7.5, float("nan")],
        "stream": ["yes", 1],
        "n": [2, "1", True],
        "stop": [["a", "b", "c", "d", "e"], 5, [5]],
        "logprobs": [True, 5],
        "presence_penalty": [1, "0"],
        "priority": ["urgent", 1],
        "model": [123, None, "", "no-such-model"],
        "max_completion_tokens": ["5", 0],
    }.items():
        for v in values:
            cases.append(Hostile(f"chat {name}={v!r}", CHAT, _json(_chat(llm, **{name: v}))))
    for messages in [
        [],
        "hi",
        [{"role": "robot", "content": "x"}],
        [{"content": "x"}],
        [{"role": "user", "content": 5}],
        [{"role": "user", "content": [{"type": "image"}]}],
    ]:
        body = {"model": llm, "messages": messages, "max_tokens": 8}
        cases.append(Hostile(f"chat messages={messages!r}"[:80], CHAT, _json(body)))
    for prompt in [["a", "b"], [], 5, None, {"text": "x"}]:
        body = {"model": llm, "prompt": prompt, "max_tokens": 8}
        cases.append(Hostile(f"completion prompt={prompt!r}", COMPLETIONS, _json(body)))
    for name, v in {"echo": True, "best_of": 2, "max_tokens": 10**6}.items():
        body = {"model": llm, "prompt": "hi", name: v}
        cases.append(Hostile(f"completion {name}={v!r}", COMPLETIONS, _json(body)))
    long_prompt = {"model": llm, "prompt": "word " * 50_000, "max_tokens": 8}
    cases.append(
        Hostile("completion prompt over the context window", COMPLETIONS, _json(long_prompt))
    )
    cases.append(
        Hostile(
            "chat stream_options without stream",
            CHAT,
            _json(_chat(llm, stream_options={"include_usage": True})),
        )
    )
    return cases


def embedding_cases(embedder: str) -> list[Hostile]:
    cases: list[Hostile] = []
    for v in ["8", True, False, 0, -1, 2**64, 1e3, 1.5, 100_000, float("nan"), [8]]:
        body = {"model": embedder, "input": "hi", "dimensions": v}
        cases.append(Hostile(f"embeddings dimensions={v!r}", EMBEDDINGS, _json(body)))
    for v in [
        "",
        [],
        [""],
        [[]],
        [[-1]],
        [[2**40]],
        [[2**64]],
        5,
        None,
        [["a"]],
        [[1.5]],
        [True],
        {"text": "x"},
    ]:
        body = {"model": embedder, "input": v}
        cases.append(
            Hostile(
                f"embeddings input={v!r}",
                EMBEDDINGS,
                _json(body),
                allowed=SAFE if v in ("", [""]) else CLIENT_ERROR,
            )
        )
    for name, v in {
        "encoding_format": "hex",
        "priority": "urgent",
        "model": "no-such-model",
        "user": 5,
    }.items():
        body = {"model": embedder, "input": "hi", name: v}
        cases.append(Hostile(f"embeddings {name}={v!r}", EMBEDDINGS, _json(body)))
    too_many = {"model": embedder, "input": ["hi"] * 3000}
    cases.append(Hostile("embeddings 3000 inputs (limit 2048)", EMBEDDINGS, _json(too_many)))
    huge = {"model": embedder, "input": "x" * (5 * 1024 * 1024)}
    cases.append(Hostile("embeddings 5 MB body (limit 4 MiB)", EMBEDDINGS, _json(huge)))
    return cases


def rerank_cases(reranker: str) -> list[Hostile]:
    cases: list[Hostile] = []
    base = {"model": reranker, "query": "q", "documents": ["a", "b"]}
    for path in RERANK_PATHS[:2]:
        for name, v in {
            "top_n": [0, -1, "3", True],
            "documents": [[], [5], [{"text": 5}], "a", None],
            "query": [5, None],
            "return_documents": ["yes", 1],
        }.items():
            for value in v:
                cases.append(
                    Hostile(f"{path} {name}={value!r}", path, _json({**base, name: value}))
                )
        cases.append(
            Hostile(f"{path} empty query", path, _json({**base, "query": ""}), allowed=SAFE)
        )
        huge_top_n = _json({**base, "top_n": 2**64})
        cases.append(Hostile(f"{path} top_n=2**64", path, huge_top_n, allowed=SAFE))
    tei = {"query": "q", "texts": ["a", "b"]}
    for name, v in {
        "texts": [[], [5], "a"],
        "raw_scores": ["yes", 1],
        "truncate": ["no"],
        "query": [None, 5],
    }.items():
        for value in v:
            cases.append(
                Hostile(f"/rerank {name}={value!r}", "/rerank", _json({**tei, name: value}))
            )
    too_many = {**base, "documents": ["d"] * 1001}
    cases.append(Hostile("rerank 1001 documents (limit 1000)", "/v1/rerank", _json(too_many)))
    # One legal-looking request that once held the reranker for 47 s: 50 documents of 34 KB.
    big = {**base, "documents": [("lorem ipsum dolor sit amet " * 1300)[:34_000]] * 50}
    cases.append(Hostile("rerank 50 documents x 34 KB", "/v1/rerank", _json(big), allowed=SAFE))
    return cases


def http_cases(embedder: str) -> list[Hostile]:
    ok_body = _json({"model": embedder, "input": "hi"})
    nested = b"[" * 100_000 + b"]" * 100_000
    nested_input = (
        b'{"model": "' + embedder.encode() + b'", "input": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    )
    cases = [
        Hostile("unknown route", "/v1/nothing-here", method="GET"),
        Hostile("unknown POST route", "/v1/nothing-here", ok_body),
        Hostile("GET on a POST route", EMBEDDINGS, method="GET"),
        Hostile("DELETE on a POST route", EMBEDDINGS, method="DELETE"),
        Hostile("HEAD /healthz", "/healthz", method="HEAD", allowed=frozenset({200})),
        Hostile("HEAD /v1/models", "/v1/models", method="HEAD", allowed=frozenset({200})),
        Hostile(
            "invalid UTF-8",
            EMBEDDINGS,
            b'{"model": "' + embedder.encode() + b'", "input": "\xff\xfe"}',
        ),
        Hostile("not JSON", EMBEDDINGS, b"{"),
        Hostile("JSON null", EMBEDDINGS, b"null"),
        Hostile("JSON list", EMBEDDINGS, b"[]"),
        Hostile("JSON string", EMBEDDINGS, b'"hi"'),
        Hostile("empty body", EMBEDDINGS, b""),
        Hostile("deeply nested JSON", EMBEDDINGS, nested),
        Hostile("deeply nested input", EMBEDDINGS, nested_input),
        Hostile("duplicate keys", EMBEDDINGS, b'{"model": 1, "model": "x", "input": "hi"}'),
        Hostile("NaN literal", CHAT, b'{"model": "m", "messages": [], "temperature": NaN}'),
        Hostile(
            "text/plain body",
            EMBEDDINGS,
            ok_body,
            headers={"Content-Type": "text/plain"},
            allowed=SAFE,
        ),
        Hostile("X-Request-Timeout abc", EMBEDDINGS, ok_body, headers={"X-Request-Timeout": "abc"}),
        Hostile("X-Request-Timeout -1", EMBEDDINGS, ok_body, headers={"X-Request-Timeout": "-1"}),
        Hostile("X-Request-Timeout NaN", EMBEDDINGS, ok_body, headers={"X-Request-Timeout": "NaN"}),
        Hostile(
            "X-Request-Timeout 1e309", EMBEDDINGS, ok_body, headers={"X-Request-Timeout": "1e309"}
        ),
        Hostile("X-Priority urgent", EMBEDDINGS, ok_body, headers={"X-Priority": "urgent"}),
        Hostile(
            "X-Request-ID 8 KB",
            EMBEDDINGS,
            ok_body,
            headers={"X-Request-ID": "r" * 8192},
            allowed=SAFE,
        ),
        Hostile(
            "Authorization garbage",
            EMBEDDINGS,
            ok_body,
            headers={"Authorization": "Basic Zm9vOmJhcg=="},
            allowed=SAFE,
        ),
    ]
    return cases + _malformed_http(ok_body)


def _malformed_http(ok_body: bytes) -> list[Hostile]:
    """Requests HAProxy sees before the app does: each must get a 400."""

    def request(head: str, body: bytes = b"") -> bytes:
        return head.replace("\n", "\r\n").encode() + b"\r\n" + body

    post = "POST /v1/embeddings HTTP/1.1\nHost: x\nContent-Type: application/json\n"
    return [
        Hostile(
            "Content-Length abc", EMBEDDINGS, raw=request(post + "Content-Length: abc\n", ok_body)
        ),
        Hostile(
            "Content-Length -1", EMBEDDINGS, raw=request(post + "Content-Length: -1\n", ok_body)
        ),
        Hostile(
            "two Content-Lengths",
            EMBEDDINGS,
            raw=request(post + f"Content-Length: {len(ok_body)}\nContent-Length: 3\n", ok_body),
        ),
        Hostile("garbage request line", "/", raw=b"GARBAGE\r\n\r\n"),
        Hostile(
            "64 KB header",
            "/healthz",
            raw=request("GET /healthz HTTP/1.1\nHost: x\nX-Big: " + "b" * 65536 + "\n"),
        ),
        Hostile(
            "bad chunk size",
            EMBEDDINGS,
            raw=request(
                post + "Transfer-Encoding: chunked\n", b"zz\r\n" + ok_body + b"\r\n0\r\n\r\n"
            ),
        ),
    ]


def corpus(models: dict[str, list[str]]) -> list[Hostile]:
    llm = models["generation"][0]
    embedder = models["embedding"][0]
    reranker = models["rerank"][0]
    return [
        *generation_cases(llm),
        *embedding_cases(embedder),
        *rerank_cases(reranker),
        *http_cases(embedder),
    ]
