"""Serves clients/examples/stream-page.html and passes GET /v1/tasks/{id}/stream on to the
drover server, so that the page's EventSource is same-origin.

    PORT=8081 DROVER_URL=http://127.0.0.1:8080 python3 examples/stream_page.py
    # then open http://127.0.0.1:8081/?task=chat-1
"""

import http.server
import os
import re
import urllib.error
import urllib.request

API = os.environ.get("DROVER_URL", "http://127.0.0.1:8080").rstrip("/")
# The page is shared with the TypeScript client's example: clients/examples/.
PAGE = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "stream-page.html"), "rb").read()


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"  # the answer ends when the stream does

    def do_GET(self):
        path = self.path.split("?", 1)[0]
        if path == "/":
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.end_headers()
            self.wfile.write(PAGE)
            return
        if not re.fullmatch(r"/v1/tasks/[^/]+/stream", path):
            self.send_error(404)
            return
        headers = {"Accept": "text/event-stream"}
        for name, env in (("Authorization", "DROVER_TOKEN"), ("Drover-Namespace", "DROVER_NAMESPACE")):
            if os.environ.get(env):
                headers[name] = ("Bearer " if env == "DROVER_TOKEN" else "") + os.environ[env]
        if self.headers.get("Last-Event-ID"):
            headers["Last-Event-ID"] = self.headers["Last-Event-ID"]
        try:
            up = urllib.request.urlopen(urllib.request.Request(API + self.path, headers=headers), timeout=60)
        except urllib.error.HTTPError as e:
            up = e
        with up:
            self.send_response(up.status if hasattr(up, "status") else up.code)
            self.send_header("Content-Type", up.headers.get("Content-Type", "text/plain"))
            self.send_header("Cache-Control", "no-cache")
            self.end_headers()
            for line in up:  # line by line: each event as it comes
                self.wfile.write(line)
                self.wfile.flush()

    def log_message(self, *args):
        pass


server = http.server.ThreadingHTTPServer(("127.0.0.1", int(os.environ.get("PORT", "8081"))), Handler)
print("open http://127.0.0.1:%d/?task=chat-1" % server.server_address[1], flush=True)
server.serve_forever()
