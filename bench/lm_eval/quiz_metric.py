"""The short-answer quiz's score: 1 when the expected word is in the reply, case ignored."""


def process_results(doc, results):
    reply = results[0] if results else ""
    return {"contains": float(doc["answer"].lower() in reply.lower())}
