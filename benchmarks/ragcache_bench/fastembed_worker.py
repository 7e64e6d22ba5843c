"""A fastembed peer for ``ragcache bench compute``, run by the fastembed venv's python (``mk/fastembed.mk``).

fastembed normally downloads its ONNX models; here it loads a local folder (``specific_model_path``) that
holds the packaged model's tokenizer files and the ONNX file ragcache exported, so it runs offline on the
very graph ragcache's ``onnx`` backend runs. One JSON line in, one out, on stdin/stdout:
``{"op": "load", "texts": [...]}``, then ``{"op": "run"}`` (embed them, answer the seconds) or
``{"op": "vectors"}`` (answer the vectors, base64 float32). It imports nothing from ragcache.
"""

import base64
import json
import sys
import time

import numpy as np
from fastembed import TextEmbedding


def main() -> None:
    folder, threads, batch_size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    model = TextEmbedding("sentence-transformers/all-MiniLM-L6-v2", specific_model_path=folder, threads=threads,
                          local_files_only=True)
    texts: list[str] = []
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        if request["op"] == "load":
            texts = request["texts"]
            answer: dict = {"count": len(texts)}
        elif request["op"] == "run":
            started = time.perf_counter()
            vectors = list(model.embed(texts, batch_size=batch_size))
            answer = {"seconds": time.perf_counter() - started, "count": len(vectors)}
        else:
            array = np.stack(list(model.embed(texts, batch_size=batch_size))).astype("<f4")
            answer = {"shape": list(array.shape), "data": base64.b64encode(array.tobytes()).decode()}
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
