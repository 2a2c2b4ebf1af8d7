"""A fake model's tokens streamed from a worker to a follower; the final
message is assembled in the task's result.

    DROVER_URL=http://127.0.0.1:8080 python3 examples/llm_tokens.py
"""

import os
import re
import threading
import time

import drover

client = drover.Client(os.environ.get("DROVER_URL", "http://127.0.0.1:8080"))
queue = "chat"
task_id = "chat-%d" % os.getpid()


def fake_model(prompt):
    """The same tokens every time, one every 5 ms."""
    for tok in re.findall(r"\S+\s*", "You asked: %s. Here is a short answer." % prompt):
        time.sleep(0.005)
        yield tok


client.submit(queue, [{"task_id": task_id, "task_type": "answer", "parameters": {"prompt": "what is drover"}}])
print("task", task_id)

# Follow before the task runs: a follower sees the same events whenever it starts.
streamed = []


def follow():
    for ev in client.follow(task_id):  # ends after done
        if ev.type == "token":
            streamed.append(ev.data["text"])
        else:
            print("#%d %s %s" % (ev.seq, ev.type, ev.data))  # attempt_started, progress, done


follower = threading.Thread(target=follow)
follower.start()


@client.worker(queue, concurrency=1)
def answer(task):
    reply = ""
    for tok in fake_model(task.params["prompt"]):
        # {"type": "token", "data": {"text": tok}}: queued, sent many per request.
        # Raises drover.Fenced once this attempt lost its claim: it stops, another runs the task.
        task.stream.token(tok)
        reply += tok
    task.stream.emit("progress", {"done": 1, "of": 1})
    return {"message": reply}  # the final message is the task's result


answer.run(max_tasks=1)
follower.join(30)
result = client.task(queue, task_id).result["message"]
print("streamed:", "".join(streamed))
print("result:  ", result)
print("same:", "".join(streamed) == result)
