"""pytest plugin (``-p no_in_place``): graphed drafters copy every input (``GraphedDrafter(in_place=False)``), to tell
whether a failure on the GPU comes from reading inputs where they lie (session 36's debugging)."""
import functools

from specdec.graphs import GraphedDrafter

_init = GraphedDrafter.__init__


@functools.wraps(_init)
def _copying(self, *args, **kwargs):
    kwargs["in_place"] = False
    _init(self, *args, **kwargs)


GraphedDrafter.__init__ = _copying
