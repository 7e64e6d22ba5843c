"""Keyword search (BM25) of a knowledge-base collection, computed by Milvus itself.

Milvus 2.5+ (Milvus Lite 2.5.1 included, checked here) runs BM25 as a collection *function*: the ``text``
field is analysed (Milvus' ``standard`` analyzer: Unicode word boundaries, lower case), the function
writes each row's term frequencies into a sparse vector field, and a search of that field with the
query's raw text ranks rows by BM25 over the collection's current statistics. So the keyword index is
part of the collection: an upsert or delete updates it in the same call, a filter applies to it as to the
dense search, a dropped collection takes it along, and there is no second store to persist or rebuild.
(``bm25s``, the alternative, builds static indexes that would have to be rebuilt from every text on each
change and kept beside Milvus.)

Collections created before this existed have no such field; ``has_keyword_index`` tells them apart, and a
keyword search of one is refused (the caller asks for ``mode``), never silently answered densely.
"""

from __future__ import annotations

from pymilvus import DataType, Function, FunctionType

__all__ = ["BM25_METRIC", "SPARSE_FIELD", "add_keyword_index", "has_keyword_index", "keyword_search_params"]

SPARSE_FIELD = "sparse"
BM25_METRIC = "BM25"
BM25_FUNCTION = "text_bm25"


def add_keyword_index(schema, index_params, *, text_field: str = "text") -> None:
    """Add the BM25 function, its sparse output field and that field's index to a new collection's schema.
    The text field must have been added with ``enable_analyzer=True``."""
    schema.add_field(SPARSE_FIELD, DataType.SPARSE_FLOAT_VECTOR)
    schema.add_function(
        Function(
            name=BM25_FUNCTION,
            function_type=FunctionType.BM25,
            input_field_names=[text_field],
            output_field_names=[SPARSE_FIELD],
        )
    )
    index_params.add_index(field_name=SPARSE_FIELD, index_type="SPARSE_INVERTED_INDEX", metric_type=BM25_METRIC)


def has_keyword_index(described: dict) -> bool:
    """Whether a collection (``MilvusClient.describe_collection``'s answer) has the BM25 field."""
    return any(field.get("name") == SPARSE_FIELD for field in described.get("fields") or ())


def keyword_search_params() -> dict:
    """``search_params`` for a BM25 search of the sparse field."""
    return {"metric_type": BM25_METRIC}
