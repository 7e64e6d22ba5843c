"""Redis and Milvus plumbing: clients, cluster pipelines, and the embedded servers."""
