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
