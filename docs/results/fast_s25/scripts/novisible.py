"""Run a script with the fast path's visible_end off (session 25's A/B; dense rows then pass prefix_end as before):
python novisible.py SCRIPT ARGS..."""
import runpy
import sys

import specdec.static

specdec.static.StaticAdapter._visible = lambda self, state, size: False
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
