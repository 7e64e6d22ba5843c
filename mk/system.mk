# Debian packages the test suite runs as real programs (a fresh machine of this kind has none of them):
#   docker-compose  validates every compose file in docker/ (tests/app/test_docker.py)
#   chromium        the headless browser that loads the /ui dashboard (tests/server/test_ui_browser.py)
#   wordnet-base    labelled retrieval data nobody here wrote (ragcache bench retrieval, the second set)
#   perl-doc        perlfaq: questions and the answers people wrote for them (ragcache bench retrieval)
#   python3.11-doc  the Python FAQ's sources: the same kind of set (ragcache bench retrieval)
#   prometheus      its promtool checks /metrics and the compose stacks' Prometheus config (tests/server/test_observability.py)
#   gcc, python3.11-dev  build the two C loops at `pip install` (tests/tiers/test_lru_index.py fails without them,
#                   so that CI cannot pass on the numpy fallback by accident)
# As root (CI, the development machine) they are installed with apt-get; otherwise make stops and says
# the one command to run. The check is a dpkg query, so a machine that has them pays nothing.
SYSTEM_PACKAGES := docker-compose chromium wordnet-base perl-doc python3.11-doc prometheus gcc python3.11-dev

.PHONY: system-deps

system-deps:
	@missing=$$(for pkg in $(SYSTEM_PACKAGES); do dpkg-query -W -f='$${Status}' $$pkg 2>/dev/null | grep -q 'ok installed' || echo $$pkg; done); \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" != 0 ]; then \
	  echo "make: the tests need these Debian packages: $$(echo $$missing). Run: sudo apt-get install -y $$(echo $$missing)" >&2; exit 1; \
	fi; \
	echo "make: installing Debian packages the tests need: $$(echo $$missing)"; \
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing
