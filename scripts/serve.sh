#!/usr/bin/env bash
# Quick start, command 1: install what is missing, build, and run `agentvm serve`.
# The first start builds the default Debian image (~2 min, cached in ~/.cache/agentvm)
# and cold-boots its template once; after that every create is a snapshot restore.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec bin/agentvm serve "$@"
