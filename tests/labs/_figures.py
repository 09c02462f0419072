"""What the labs' picture tests share: a figure drawn to PNG (so that drawing errors surface),
and a figure's artists found by the ``gid`` each lab's viz.py tags them with."""
import io

from matplotlib.figure import Figure


def render(fig):
    """``fig`` (a matplotlib Figure), after drawing it to an in-memory PNG."""
    assert isinstance(fig, Figure)
    fig.savefig(io.BytesIO(), format="png")
    return fig


def by_gid(artists, prefix: str) -> list:
    """The artists whose gid starts with ``prefix``."""
    return [a for a in artists if (a.get_gid() or "").startswith(prefix)]
