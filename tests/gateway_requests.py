"""The chat requests the molecule scenarios send through a provisioned gateway, as a Python script
run on the gateway host itself (it has python3, no curl; the master key is read there from the
proxy's env file, never copied out). Used by molecule/stack (test_stack_monitoring.py) and
molecule/scaleout (test_scaleout.py). Importable on its own:

    sys.path.insert(0, str(REPO / "tests"))
    from gateway_requests import chat_codes_script
"""

from __future__ import annotations


def chat_codes_script(env_file: str, model: str, n: int, max_tokens: int = 8, stream: bool = False,
                      timeout: int = 120, url: str = "https://127.0.0.1:4000/v1/chat/completions",
                      ca_file: str = "/etc/labctl/tls/ca.crt") -> str:
    """A script that sends `n` chat completions one after the other and prints their HTTP status
    codes as a JSON list (an HTTP error is a code, not an exception)."""
    return f"""
import json, ssl, urllib.request, urllib.error
ctx = ssl.create_default_context(cafile={ca_file!r}) if {url!r}.startswith("https") else None
key = next(l.split("=", 1)[1].strip() for l in open({env_file!r}) if l.startswith("LITELLM_MASTER_KEY="))
codes = []
for i in range({n}):
    body = json.dumps({{"model": {model!r}, "messages": [{{"role": "user", "content": "count to " + str(i)}}],
                       "max_tokens": {max_tokens}, "stream": {stream!r}}}).encode()
    req = urllib.request.Request({url!r}, data=body,
                                 headers={{"Content-Type": "application/json", "Authorization": "Bearer " + key}})
    try:
        with urllib.request.urlopen(req, timeout={timeout}, context=ctx) as r:
            r.read(); codes.append(r.status)
    except urllib.error.HTTPError as e:
        codes.append(e.code)
print(json.dumps(codes))
"""


# A function whose arguments the tiny random model can only get right under vLLM's structured
# outputs: one parameter, an enum of two short words, strict (vLLM then pins the argument schema).
TOOL = {"type": "function", "function": {
    "name": "set_mode", "description": "Switch the lab's demo lamp on or off.", "strict": True,
    "parameters": {"type": "object", "properties": {"mode": {"type": "string", "enum": ["on", "off"]}},
                   "required": ["mode"], "additionalProperties": False}}}


def tool_calls_script(env_file: str, model: str, url: str = "https://127.0.0.1:4000/v1",
                      ca_file: str = "/etc/labctl/tls/ca.crt", max_tokens: int = 200, timeout: int = 120) -> str:
    """A script for the python of the gateway's venv (it has the openai SDK LiteLLM depends on) that
    sends chat requests with TOOL through the gateway with the SDK, each plain and streamed: tool_choice
    "auto" (the model may answer in text), "required" and the named function (vLLM's structured
    outputs force a call), then a second turn carrying the call and its result. It prints one JSON
    object per case: the HTTP error (status and message) or what came back, in the SDK's OpenAI
    types (the streamed tool call put together from its deltas as a client does)."""
    return f"""
import json, httpx, openai
key = next(l.split("=", 1)[1].strip() for l in open({env_file!r}) if l.startswith("LITELLM_MASTER_KEY="))
client = openai.OpenAI(base_url={url!r}, api_key=key, timeout={timeout}, max_retries=0,
                       http_client=httpx.Client(verify={ca_file!r}))
tools = [{TOOL!r}]
question = [{{"role": "user", "content": "Turn the lamp on"}}]
choices = {{"auto": "auto", "required": "required", "named": {{"type": "function", "function": {{"name": "set_mode"}}}}}}
out = []
for name, choice in choices.items():
    for stream in (False, True):
        case = {{"case": name, "stream": stream}}
        try:
            args = dict(model={model!r}, messages=question, tools=tools, tool_choice=choice, max_tokens={max_tokens},
                        seed=7, parallel_tool_calls=False)
            if not stream:
                r = client.chat.completions.create(**args)
                c = r.choices[0]
                case.update(status=200, object=r.object, finish_reason=c.finish_reason, role=c.message.role,
                            content=c.message.content,
                            tool_calls=[t.model_dump(exclude_none=True) for t in c.message.tool_calls or []])
            else:
                calls, finish, objects, text = {{}}, None, set(), ""
                for chunk in client.chat.completions.create(stream=True, **args):
                    objects.add(chunk.object)
                    for c in chunk.choices:
                        finish = c.finish_reason or finish
                        text += c.delta.content or ""
                        for d in c.delta.tool_calls or []:
                            call = calls.setdefault(d.index, {{"id": None, "type": None, "function": {{"name": "", "arguments": ""}}}})
                            call["id"] = d.id or call["id"]
                            call["type"] = d.type or call["type"]
                            if d.function is not None:
                                call["function"]["name"] += d.function.name or ""
                                call["function"]["arguments"] += d.function.arguments or ""
                case.update(status=200, object=sorted(objects), finish_reason=finish, content=text,
                            tool_calls=[calls[i] for i in sorted(calls)])
        except openai.APIStatusError as e:
            case.update(status=e.status_code, error=str(e)[:600])
        out.append(case)
# An agent's next turn: the call and its result go back; the model answers.
forced = next((c for c in out if c["case"] == "required" and not c["stream"] and c.get("tool_calls")), None)
if forced:
    call = forced["tool_calls"][0]
    turn = question + [{{"role": "assistant", "content": None, "tool_calls": [call]}},
                       {{"role": "tool", "tool_call_id": call["id"], "content": "the lamp is on"}}]
    case = {{"case": "result", "stream": False}}
    try:
        r = client.chat.completions.create(model={model!r}, messages=turn, tools=tools, max_tokens=16, seed=7)
        case.update(status=200, finish_reason=r.choices[0].finish_reason, role=r.choices[0].message.role)
    except openai.APIStatusError as e:
        case.update(status=e.status_code, error=str(e)[:600])
    out.append(case)
print(json.dumps(out))
"""
