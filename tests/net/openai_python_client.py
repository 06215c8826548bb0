"""The official OpenAI Python client (pip `openai`, installed by scripts/setup) against a
running `computron serve`: the client most applications use, beside the npm one
(tests/net/clients/openai_client.cjs).

Usage: python3 openai_python_client.py URL MODEL completions|chat
Prints one JSON object with what it saw; the C++ test (openai_python_e2e_test.cpp) judges it.
Every reply is also validated against the client's own pydantic types (the client itself
builds them without validating, so a wrong field would otherwise pass unseen): what does
not fit is listed in "schema_errors".
"""

import json
import sys
import traceback

import openai
import pydantic
from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk

schema_errors = []


def strict(cls, raw, where, streamed_completion=False):
    """Validates `raw` as `cls` and records each field that does not fit."""
    try:
        cls.model_validate(raw)
    except pydantic.ValidationError as e:
        for err in e.errors():
            # OpenAI's own completion streams send finish_reason null until a choice ends,
            # which the client's type (shared with the unstreamed reply) does not allow.
            if streamed_completion and err["loc"][-1] == "finish_reason" and err["input"] is None:
                continue
            schema_errors.append({"where": where, "loc": [str(x) for x in err["loc"]],
                                  "msg": err["msg"], "input": repr(err["input"])[:200]})


def usage_of(u):
    if u is None:
        return None
    return {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
            "total_tokens": u.total_tokens}


def completion_logprobs(lp):
    if lp is None:
        return None
    return {"tokens": lp.tokens, "token_logprobs": lp.token_logprobs,
            "top_logprobs": lp.top_logprobs, "text_offset": lp.text_offset}


def chat_logprobs(lp):
    if lp is None or lp.content is None:
        return None
    return [{"token": t.token, "logprob": t.logprob, "bytes": t.bytes,
             "top": [{"token": x.token, "logprob": x.logprob, "bytes": x.bytes}
                     for x in t.top_logprobs]} for t in lp.content]


def plain(resource, cls, where, **params):
    """One unstreamed request: what the client parsed, the raw body checked against `cls`."""
    raw = resource.with_raw_response.create(**params)
    obj = raw.parse()
    strict(cls, raw.http_response.json(), where)
    chat = cls is ChatCompletion
    out = {"typed": isinstance(obj, cls), "id": obj.id, "object": obj.object,
           "created_int": isinstance(obj.created, int), "model": obj.model,
           "usage": usage_of(obj.usage), "choices": []}
    for c in obj.choices:
        choice = {"index": c.index, "finish": c.finish_reason}
        if chat:
            choice["role"] = c.message.role
            choice["text"] = c.message.content
            choice["logprobs"] = chat_logprobs(c.logprobs)
        else:
            choice["text"] = c.text
            choice["logprobs"] = completion_logprobs(c.logprobs)
        out["choices"].append(choice)
    return out


def streamed(resource, cls, where, **params):
    """One streamed request: the chunks joined per choice, in the shape `plain` gives."""
    chat = cls is ChatCompletionChunk
    out = {"typed": True, "objects": [], "ids": [], "chunks": 0, "usage": None,
           "usage_last": None, "first_role": {}, "choices": {}}
    for chunk in resource.create(stream=True, **params):
        out["chunks"] += 1
        out["typed"] = out["typed"] and isinstance(chunk, cls)
        strict(cls, chunk.model_dump(exclude_unset=True, warnings=False),
               where + " chunk " + str(out["chunks"]), streamed_completion=not chat)
        for key, value in (("objects", chunk.object), ("ids", chunk.id)):
            if value not in out[key]:
                out[key].append(value)
        if chunk.usage is not None:
            out["usage"] = usage_of(chunk.usage)
            out["usage_last"] = len(chunk.choices) == 0
        elif out["usage"] is not None:
            out["usage_last"] = False  # something came after the usage chunk
        for c in chunk.choices:
            slot = out["choices"].setdefault(c.index, {"index": c.index, "finish": None,
                                                      "text": "", "logprobs": None})
            if chat:
                out["first_role"].setdefault(str(c.index), c.delta.role)
                slot["role"] = slot.get("role") or c.delta.role
                slot["text"] += c.delta.content or ""
                lp = chat_logprobs(c.logprobs)
                if lp is not None:
                    slot["logprobs"] = (slot["logprobs"] or []) + lp
            else:
                slot["text"] += c.text
                lp = completion_logprobs(c.logprobs)
                if lp is not None:
                    if slot["logprobs"] is None:
                        slot["logprobs"] = {k: [] for k in lp}
                    for k, v in lp.items():
                        slot["logprobs"][k] += v or []
            if c.finish_reason is not None:
                if slot["finish"] is not None:
                    slot["finish_twice"] = True
                slot["finish"] = c.finish_reason
    out["choices"] = [out["choices"][i] for i in sorted(out["choices"])]
    return out


def failure(resource, **params):
    """A request that must fail: the client's exception class and what it carries."""
    try:
        resource.create(**params)
        return {"class": None}
    except openai.APIStatusError as e:
        body = e.body if isinstance(e.body, dict) else {}
        return {"class": type(e).__name__,
                "not_found": isinstance(e, openai.NotFoundError),
                "bad_request": isinstance(e, openai.BadRequestError),
                "status": e.status_code, "code": e.code, "param": e.param, "type": e.type,
                "message": e.message, "server_message": body.get("message")}


def stop_from(text):
    """A stop string from the middle of `text` (three ASCII letters or digits where there
    are, so that no partial character is cut) and the text a stop there leaves."""
    at = next((i for i in range(3, len(text) - 2)
               if all(c.isascii() and c.isalnum() for c in text[i:i + 3])), 3)
    stop = text[at:at + 3]
    return stop, text[:text.index(stop)]


def completions(client, model, out):
    res = client.completions
    out["models"] = [m.id for m in client.models.list().data]
    out["model_card"] = client.models.retrieve(model).id
    prompt = "Hello world"
    greedy = {"model": model, "prompt": prompt, "max_tokens": 16, "temperature": 0}
    out["greedy"] = plain(res, Completion, "greedy", **greedy)
    out["greedy_stream"] = streamed(res, Completion, "greedy stream", **greedy,
                                    stream_options={"include_usage": True})
    # The prompt as token ids: counted as given.
    ids = [9906, 1917, 11, 1618]
    out["ids"] = plain(res, Completion, "ids", model=model, prompt=ids, max_tokens=2,
                       temperature=0)
    out["ids_count"] = len(ids)
    # n samples with a seed: the same twice, and the same streamed.
    sampled = {"model": model, "prompt": prompt, "max_tokens": 6, "n": 2, "seed": 7,
               "temperature": 1}
    out["n"] = plain(res, Completion, "n", **sampled)
    out["n_again"] = plain(res, Completion, "n again", **sampled)
    out["n_stream"] = streamed(res, Completion, "n stream", **sampled)
    out["other_seed"] = plain(res, Completion, "other seed", **{**sampled, "seed": 8})
    # vLLM's top_k through extra_body: top_k 1 samples the greedy answer at any temperature.
    out["top_k_1"] = plain(res, Completion, "top_k 1", **{**greedy, "temperature": 1, "seed": 3},
                           extra_body={"top_k": 1})
    lp = {"model": model, "prompt": prompt, "max_tokens": 5, "temperature": 0, "logprobs": 3}
    out["logprobs"] = plain(res, Completion, "logprobs", **lp)
    out["logprobs_stream"] = streamed(res, Completion, "logprobs stream", **lp)
    # Sampled with a seed, the tiny model's text runs through many scripts (greedy repeats
    # one token): non-ASCII tokens in the logprobs, and a varied text to stop in.
    one = {"model": model, "prompt": prompt, "max_tokens": 12, "temperature": 1, "seed": 1}
    out["logprobs_sampled"] = plain(res, Completion, "logprobs sampled", **one, logprobs=2)
    out["logprobs_sampled_stream"] = streamed(res, Completion, "logprobs sampled stream", **one,
                                              logprobs=2)
    stop, out["stop_expected"] = stop_from(out["logprobs_sampled"]["choices"][0]["text"])
    out["stop"] = stop
    out["stopped"] = plain(res, Completion, "stopped", **one, stop=[stop])
    out["stopped_stream"] = streamed(res, Completion, "stopped stream", **one, stop=stop)
    out["stop_kept"] = plain(res, Completion, "stop kept", **one, stop=[stop],
                             extra_body={"include_stop_str_in_output": True})
    out["short"] = plain(res, Completion, "short", **{**greedy, "max_tokens": 3})
    base = {"model": model, "prompt": prompt, "max_tokens": 4}
    out["unknown_model"] = failure(res, **{**base, "model": "no-such-model"})
    out["unknown_model_stream"] = failure(res, **{**base, "model": "no-such-model"}, stream=True)
    out["bad_field"] = failure(res, **base, extra_body={"tempreature": 0.5})
    out["bad_range"] = failure(res, **{**base, "max_tokens": 0})
    out["unsupported"] = failure(res, **base, best_of=2)


def chat(client, model, out, eos_id=128009):
    res = client.chat.completions
    messages = [{"role": "system", "content": "You are terse."},
                {"role": "user", "content": "Name a colour."}]
    greedy = {"model": model, "messages": messages, "max_tokens": 16, "temperature": 0}
    out["greedy"] = plain(res, ChatCompletion, "greedy", **greedy)
    out["greedy_stream"] = streamed(res, ChatCompletionChunk, "greedy stream", **greedy,
                                    stream_options={"include_usage": True})
    # max_completion_tokens, the name newer clients send for max_tokens.
    out["completion_tokens"] = plain(res, ChatCompletion, "max_completion_tokens", model=model,
                                     messages=messages, max_completion_tokens=3, temperature=0)
    sampled = {"model": model, "messages": messages, "max_tokens": 6, "n": 2, "seed": 7,
               "temperature": 1}
    out["n"] = plain(res, ChatCompletion, "n", **sampled)
    out["n_again"] = plain(res, ChatCompletion, "n again", **sampled)
    out["n_stream"] = streamed(res, ChatCompletionChunk, "n stream", **sampled)
    out["other_seed"] = plain(res, ChatCompletion, "other seed", **{**sampled, "seed": 8})
    out["top_k_1"] = plain(res, ChatCompletion, "top_k 1",
                           **{**greedy, "temperature": 1, "seed": 3}, extra_body={"top_k": 1})
    lp = {"model": model, "messages": messages, "max_tokens": 5, "temperature": 0,
          "logprobs": True, "top_logprobs": 3}
    out["logprobs"] = plain(res, ChatCompletion, "logprobs", **lp)
    out["logprobs_stream"] = streamed(res, ChatCompletionChunk, "logprobs stream", **lp)
    one = {"model": model, "messages": messages, "max_tokens": 12, "temperature": 1, "seed": 1}
    out["logprobs_sampled"] = plain(res, ChatCompletion, "logprobs sampled", **one,
                                    logprobs=True, top_logprobs=2)
    out["logprobs_sampled_stream"] = streamed(res, ChatCompletionChunk,
                                              "logprobs sampled stream", **one, logprobs=True,
                                              top_logprobs=2)
    stop, out["stop_expected"] = stop_from(out["logprobs_sampled"]["choices"][0]["text"])
    out["stop"] = stop
    out["stopped"] = plain(res, ChatCompletion, "stopped", **one, stop=[stop])
    out["stopped_stream"] = streamed(res, ChatCompletionChunk, "stopped stream", **one,
                                     stop=stop)
    # An EOS id of the model (<|eot_id|>, 128009, for the tiny Llama; the caller names
    # another): forced by logit_bias it ends the answer at once with "stop"; with vLLM's
    # ignore_eos (extra_body) it runs to the length.
    forced = {**greedy, "max_tokens": 3, "logit_bias": {str(eos_id): 100}}
    out["eos"] = plain(res, ChatCompletion, "eos", **forced)
    out["eos_ignored"] = plain(res, ChatCompletion, "eos ignored", **forced,
                               extra_body={"ignore_eos": True})
    base = {"model": model, "messages": messages, "max_tokens": 4}
    out["unknown_model"] = failure(res, **{**base, "model": "no-such-model"})
    out["unknown_model_stream"] = failure(res, **{**base, "model": "no-such-model"}, stream=True)
    out["bad_field"] = failure(res, **base, extra_body={"tempreature": 0.5})
    out["top_logprobs_alone"] = failure(res, **base, top_logprobs=2)
    out["bad_role"] = failure(res, **{**base, "messages": [{"role": "wizard", "content": "x"}]})
    out["tools"] = failure(res, **base, tools=[{"type": "function", "function": {"name": "f"}}])
    # The fields OpenAI's API defines that change nothing here, as this client sends them
    # (typed arguments), and vLLM's through extra_body: accepted; request_id names the answer.
    out["extras"] = plain(res, ChatCompletion, "extras", **greedy, store=False,
                          metadata={"team": "a"}, service_tier="auto", reasoning_effort="low",
                          modalities=["text"], prompt_cache_key="k", safety_identifier="u1",
                          extra_body={"priority": 1, "request_id": "req-42",
                                      "truncate_prompt_tokens": -1})
    out["beam"] = failure(res, **base, extra_body={"use_beam_search": True})


def main():
    url, model, mode = sys.argv[1:4]
    eos_id = int(sys.argv[4]) if len(sys.argv) > 4 else 128009
    out = {"mode": mode, "openai_version": openai.__version__}
    try:
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0,
                               timeout=60)
        if mode == "chat":
            chat(client, model, out, eos_id)
        else:
            completions(client, model, out)
    except Exception:  # the C++ test prints it
        out["fatal"] = traceback.format_exc()
    out["schema_errors"] = schema_errors
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
