"""The one outbound HTTP helper: every call ragcache makes to an upstream goes through an ``Upstream``.

    Upstream         one upstream service (a remote embedding model, the remote reranker, vLLM and LMCache):
                     its connections, its key and its breaker; ``post``/``get`` bound every call
    CallLimits       the overall deadline, connect timeout, retries, back-off and concurrency of its calls
    retry_after_s    a ``Retry-After`` header as seconds (the one parser of it)
    canonical_url    the rule a configured base URL passes (plain http(s), no credentials, query or fragment)

What every call gets, whoever makes it, on pooled keep-alive sockets with httptools' compiled parser
(``_wire.py``): an overall deadline that every socket operation keeps (a trickling upstream is cut off at it, not
after each read), a byte cap on the answer (counted as it arrives, aborted past it), no redirects and no proxy from
the environment, retries of 429/5xx/dropped connections within the deadline (``Retry-After`` honoured), the breaker
(``ragcache.core.tier.TierHealth``; a timeout opens it like a refusal; a caller's own key has its own), and masking:
no key or URL credential appears in an error or log line, and a 401/403 body is never quoted. Failures are the
``UpstreamError`` family of ``ragcache.errors``.

Inside: ``_upstream.py`` the call (deadline, slots, retries, breakers), ``_answers.py`` what one answer means (a
status read into an error or a retry, masked), ``_wire.py`` the sockets, ``urls.py`` the URL rule.
"""

from ragcache.outbound._answers import Secret, retry_after_s
from ragcache.outbound._upstream import CallLimits, CallObserver, Upstream
from ragcache.outbound._wire import WireTransport
from ragcache.outbound.urls import canonical_url

__all__ = ["CallLimits", "CallObserver", "Secret", "Upstream", "WireTransport", "canonical_url", "retry_after_s"]
