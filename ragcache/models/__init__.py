"""What turns text into vectors: the local model (``local``: torch, ``onnx``), the remote providers (``remote``),
prompts, drift checks and fingerprints."""
