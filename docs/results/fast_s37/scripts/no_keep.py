"""pytest plugin (``-p no_keep``): the code as it was before session 37's fix, to show the defect it fixes. A captured
graph keeps no tensor its function closes over (``closure_tensors`` finds none), and the fast path's verify step makes
its root-column constant outside the buffers' constants again (``StaticAdapter._const`` keeps no ``"first"``)."""
import specdec.graphs as graphs
from specdec.static import StaticAdapter

graphs.closure_tensors = lambda fn, max_depth=8: ()
_const = StaticAdapter._const


def _not_kept(buf, key, make):
    return make() if key[0] == "first" else _const(buf, key, make)


StaticAdapter._const = staticmethod(_not_kept)
