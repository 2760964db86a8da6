#!/bin/bash
# Prepared in session 48 for the next device (not run): the fixture's three targets at this code, as sessions 30, 37
# and 38 ran them (the six heads trained first in the same call, every specdec method beside gpt-fast in one
# process, 8 prompts, 2 warm-ups: session 48's call C timed one prompt and is void). Carry .fixtures/fx; one call.
exec bash docs/results/fast_s30/scripts/gpuD.sh
