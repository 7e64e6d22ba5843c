"""Ingest reads what people have: PDF and HTML beside text and Markdown, chunked by the same rules; a file that cannot
be read, or that ingest does not read, is named with the reason instead of dropped."""

from __future__ import annotations

import pytest

from ragcache.retrieval.ingest import SkippedFile, chunk_text, find_sources, iter_documents, read_documents
from ragcache.retrieval.readers import UnreadableFileError, read_text


def pdf_bytes(pages: list[list[str]]) -> bytes:
    """A small real PDF, one page per list of lines, in Helvetica: written out by hand (object offsets and all), so
    the test needs no PDF writer, and pypdf reads it as any PDF."""
    objects = ["<< /Type /Catalog /Pages 2 0 R >>", None, "<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>"]
    kids = []
    for lines in pages:
        text = " ".join(f"({line}) Tj T*" for line in lines)
        content = f"BT /F1 12 Tf 72 720 Td 14 TL {text} ET".encode()
        objects.append(f"<< /Length {len(content)} >>\nstream\n{content.decode()}\nendstream")
        objects.append(f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents {len(objects)} 0 R "
                       "/Resources << /Font << /F1 3 0 R >> >> >>")
        kids.append(f"{len(objects)} 0 R")
    objects[1] = f"<< /Type /Pages /Kids [{' '.join(kids)}] /Count {len(kids)} >>"
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += f"{number} 0 obj\n{body}\nendobj\n".encode()
    xref = len(out)
    out += f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode()
    out += b"".join(f"{offset:010d} 00000 n \n".encode() for offset in offsets)
    out += f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode()
    return bytes(out)


HTML = """<!doctype html><html><head><title>ignored</title><style>p { color: red }</style>
<script>var tracking = "never text";</script></head>
<body><h1>Caching embeddings</h1>
<p>A <b>KV cache</b> keeps
   attention keys and values.</p>
<ul><li>Redis is L2.</li><li>Milvus is L3.</li></ul></body></html>"""


def test_a_pdf_is_read_page_by_page_and_chunked_like_text(tmp_path):
    (tmp_path / "paper.pdf").write_bytes(pdf_bytes([["A KV cache keeps keys.", "And values too."], ["Page two: Redis."]]))
    text = read_text(tmp_path / "paper.pdf")
    assert text == "A KV cache keeps keys.\nAnd values too.\n\nPage two: Redis."
    documents = list(iter_documents(tmp_path, max_chars=30))
    assert [document["text"] for document in documents] == chunk_text(text, 30)
    assert [document["id"] for document in documents] == ["paper.pdf#0", "paper.pdf#1"]
    assert documents[0]["metadata"] == {"source": "paper.pdf", "chunk": 0}


def test_html_gives_its_visible_text_in_paragraphs(tmp_path):
    (tmp_path / "page.html").write_text(HTML)
    assert read_text(tmp_path / "page.html") == (
        "Caching embeddings\n\nA KV cache keeps attention keys and values.\n\nRedis is L2.\n\nMilvus is L3."
    )
    [document] = iter_documents(tmp_path / "page.html")
    assert document["id"] == "page.html#0" and "tracking" not in document["text"]


def test_a_folder_names_the_files_it_skips_and_why(tmp_path):
    (tmp_path / "notes.md").write_text("Notes.")
    (tmp_path / "photo.png").write_bytes(b"\x89PNG\r\n")
    (tmp_path / "broken.pdf").write_bytes(b"%PDF-1.4 this is not a PDF at all")
    (tmp_path / "scan.pdf").write_bytes(pdf_bytes([[]]))  # a page without a text layer
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "HEAD").write_text("ref: refs/heads/main")  # hidden: not a document, and not listed
    sources = find_sources(tmp_path)
    assert [name for _, name in sources.files] == ["broken.pdf", "empty.txt", "notes.md", "scan.pdf"]
    assert [skipped.source for skipped in sources.skipped] == ["photo.png"]
    assert "not a kind ingest reads" in sources.skipped[0].reason
    unreadable: list[SkippedFile] = []
    documents = list(read_documents(sources.files, unreadable))
    assert [document["id"] for document in documents] == ["notes.md#0"]
    reasons = {skipped.source: skipped.reason for skipped in unreadable}
    assert set(reasons) == {"broken.pdf", "empty.txt", "scan.pdf"}
    assert reasons["broken.pdf"].startswith("not a readable PDF")
    assert "no text layer" in reasons["scan.pdf"]
    assert reasons["empty.txt"] == "no text in it"


def test_an_unreadable_file_raises_a_named_error_from_iter_documents(tmp_path):
    (tmp_path / "broken.pdf").write_bytes(b"not a pdf")
    with pytest.raises(UnreadableFileError, match="not a readable PDF") as info:
        list(iter_documents(tmp_path))
    assert info.value.field == "path"
