"""What a job's process has, whatever runs in it (the evaluator, the trainers, the worker): its sink
(sink.py: how it reports events, metrics, samples and checkpoints without knowing where they go)
and its process plumbing (processes.py: its rank, a child that dies with its parent, a free port).
Server-side: the SDK (mathrl/) holds none of it."""
