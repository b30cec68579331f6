"""Helpers that run inside each Python kernel (not in the server).

pycontext.py reads this file's source and executes it in every ipykernel as
the private module ``_agentvm_codeinterp`` (it is never imported by the
server itself).  It may only use the standard library at import time;
IPython, numpy, pandas, matplotlib and PIL are used lazily.
"""

import datetime as _dt
import math
import os
import re
import sys

_saved_env = None


def set_env(env):
    global _saved_env
    _saved_env = {k: os.environ.get(k) for k in env}
    os.environ.update(env)


def set_global_env(env, unset):
    for k in unset:
        os.environ.pop(k, None)
    os.environ.update(env)


def restore_env():
    global _saved_env
    saved, _saved_env = _saved_env, None
    for k, v in (saved or {}).items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def jsonable(v, depth=0):
    if v is None or isinstance(v, (bool, str)):
        return v
    if isinstance(v, int):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if depth > 32:
        return str(v)
    pd = sys.modules.get("pandas")
    if pd is not None and v is pd.NaT:
        return None
    if isinstance(v, (_dt.datetime, _dt.date, _dt.time)):
        return v.isoformat()
    if isinstance(v, dict):
        return {str(k): jsonable(x, depth + 1) for k, x in v.items()}
    if isinstance(v, (list, tuple, set, frozenset)):
        return [jsonable(x, depth + 1) for x in v]
    np = sys.modules.get("numpy")
    if np is not None:
        if isinstance(v, np.datetime64):
            return None if np.isnat(v) else str(v)
        if isinstance(v, np.generic):
            return jsonable(v.item(), depth + 1)
        if isinstance(v, np.ndarray):
            return jsonable(v.tolist(), depth + 1)
    if pd is not None:
        if isinstance(v, pd.Timedelta):
            return str(v)
        try:
            if pd.isna(v) is True:
                return None
        except (TypeError, ValueError):
            pass
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    if isinstance(v, complex):
        return str(v)
    try:
        return float(v)
    except (TypeError, ValueError):
        return str(v)


def dataframe_data(df):
    try:
        return {str(k): [jsonable(x) for x in col]
                for k, col in df.to_dict(orient="list").items()}
    except Exception:
        return None


# -- chart extraction from matplotlib figures --------------------------------

def _unit(label):
    if not label:
        return None
    m = re.search(r"[(\[]([^()\[\]]+)[)\]]\s*$", label)
    return m.group(1).strip() if m else None


def _axis_kind(axis):
    import matplotlib.category as mcat
    import matplotlib.dates as mdates
    conv = getattr(axis, "converter", None)
    if conv is None and hasattr(axis, "get_converter"):
        conv = axis.get_converter()
    fmt = axis.get_major_formatter()
    date_convs = tuple(c for c in (getattr(mdates, "DateConverter", None),
                                   getattr(mdates, "ConciseDateConverter", None),
                                   getattr(mdates, "_SwitchableDateConverter", None)) if c)
    date_fmts = tuple(c for c in (getattr(mdates, "DateFormatter", None),
                                  getattr(mdates, "AutoDateFormatter", None),
                                  getattr(mdates, "ConciseDateFormatter", None)) if c)
    if (date_convs and isinstance(conv, date_convs)) or (date_fmts and isinstance(fmt, date_fmts)):
        return "datetime"
    if isinstance(conv, mcat.StrCategoryConverter) or isinstance(fmt, mcat.StrCategoryFormatter):
        return "categorical"
    return None


def _value(v, kind, axis):
    if kind == "datetime":
        import matplotlib.dates as mdates
        try:
            if not isinstance(v, (int, float)) and type(v).__module__ == "numpy" and hasattr(v, "item"):
                v = v.item() if not hasattr(v, "dtype") or v.dtype.kind in "iuf" else v
            if isinstance(v, (int, float)):
                return mdates.num2date(v).isoformat()
            return mdates.num2date(mdates.date2num(v)).isoformat()
        except Exception:
            return str(v)
    if kind == "categorical":
        if isinstance(v, str):
            return v
        try:
            return str(axis.get_major_formatter()(v))
        except Exception:
            return str(v)
    try:
        f = float(v)
        return f if math.isfinite(f) else None
    except (TypeError, ValueError):
        return str(v)


def _ticks(ax, which):
    axis = ax.xaxis if which == "x" else ax.yaxis
    lo, hi = sorted(ax.get_xlim() if which == "x" else ax.get_ylim())
    locs = [float(x) for x in axis.get_ticklocs()]
    try:
        labels = [str(s) for s in axis.get_major_formatter().format_ticks(locs)]
    except Exception:
        labels = [str(x) for x in locs]
    kind = _axis_kind(axis)
    eps = abs(hi - lo) * 1e-9
    ticks, tick_labels = [], []
    for loc, lab in zip(locs, labels):
        if lo - eps <= loc <= hi + eps:
            ticks.append(_value(loc, kind, axis) if kind != "categorical" else loc)
            tick_labels.append(lab)
    scale = kind or ax.get_xscale() if which == "x" else kind or ax.get_yscale()
    return ticks, tick_labels, scale, kind


def _label(artist):
    lab = artist.get_label()
    if lab is None or str(lab).startswith("_"):
        return ""
    return str(lab)


def _base2d(ax, type_):
    xl, yl = ax.get_xlabel() or None, ax.get_ylabel() or None
    return {"type": type_, "title": ax.get_title() or None,
            "x_label": xl, "y_label": yl, "x_unit": _unit(xl), "y_unit": _unit(yl)}


def _tick_label_at(ax, which, pos):
    axis = ax.xaxis if which == "x" else ax.yaxis
    if _axis_kind(axis) == "categorical":
        return _value(pos, "categorical", axis)
    ticks, labels, _, _ = _ticks(ax, which)
    best = None
    for t, lab in zip(ticks, labels):
        if isinstance(t, float) and (best is None or abs(t - pos) < abs(best[0] - pos)):
            best = (t, lab)
    if best is not None and abs(best[0] - pos) < 0.5:
        return best[1]
    return str(round(pos, 6))


def _is_rect_line(line):
    xs, ys = line.get_xdata(), line.get_ydata()
    return (len(xs) == 5 and len(ys) == 5 and xs[0] == xs[-1] and ys[0] == ys[-1]
            and len(set(map(float, xs))) == 2 and len(set(map(float, ys))) == 2)


def _box_chart(ax):
    from matplotlib.patches import PathPatch
    rects = []
    for line in ax.get_lines():
        if _is_rect_line(line):
            rects.append((line, [float(x) for x in line.get_xdata()], [float(y) for y in line.get_ydata()]))
    for p in ax.patches:
        if isinstance(p, PathPatch):
            v = p.get_path().vertices
            xs, ys = sorted(set(map(float, v[:, 0]))), sorted(set(map(float, v[:, 1])))
            if len(xs) == 2 and len(ys) == 2:
                rects.append((p, xs, ys))
    if not rects:
        return None
    lines = [l for l in ax.get_lines() if not any(l is r[0] for r in rects)]
    elements = []
    for _, xs, ys in sorted(rects, key=lambda r: min(r[1])):
        x0, x1, q1, q3 = min(xs), max(xs), min(ys), max(ys)
        cx, w = (x0 + x1) / 2, (x1 - x0)
        lo, hi, med, outliers = q1, q3, None, []
        for l in lines:
            lx, ly = [float(x) for x in l.get_xdata()], [float(y) for y in l.get_ydata()]
            if not lx:
                continue
            if l.get_linestyle() in ("None", "", " ") and all(abs(x - cx) <= w for x in lx):
                outliers.extend(ly)
            elif len(lx) == 2 and lx[0] == lx[1] and abs(lx[0] - cx) <= w / 2:
                if max(ly) <= q1 + 1e-12:
                    lo = min(lo, min(ly))
                elif min(ly) >= q3 - 1e-12:
                    hi = max(hi, max(ly))
            elif len(lx) == 2 and ly[0] == ly[1] and x0 - 1e-9 <= min(lx) and max(lx) <= x1 + 1e-9 \
                    and q1 <= ly[0] <= q3:
                med = ly[0]
        if med is None:
            return None
        elements.append({"label": _tick_label_at(ax, "x", cx), "min": lo, "first_quartile": q1,
                         "median": med, "third_quartile": q3, "max": hi, "outliers": outliers})
    chart = _base2d(ax, "box_and_whisker")
    chart["elements"] = elements
    return chart


def axes_chart(ax):
    from matplotlib.collections import PathCollection
    from matplotlib.container import BarContainer
    from matplotlib.patches import Wedge
    title = ax.get_title() or None
    wedges = [p for p in ax.patches if isinstance(p, Wedge)]
    if wedges:
        return {"type": "pie", "title": title, "elements": [
            {"label": _label(w), "angle": round(abs(w.theta2 - w.theta1), 4), "radius": float(w.r)}
            for w in wedges]}
    bars = [c for c in ax.containers if isinstance(c, BarContainer)]
    if bars:
        chart = _base2d(ax, "bar")
        elements = []
        for c in bars:
            horizontal = getattr(c, "orientation", "vertical") == "horizontal"
            group = _label(c)
            for r in c.patches:
                if horizontal:
                    pos, value = r.get_y() + r.get_height() / 2, r.get_width()
                    label = _tick_label_at(ax, "y", pos)
                else:
                    pos, value = r.get_x() + r.get_width() / 2, r.get_height()
                    label = _tick_label_at(ax, "x", pos)
                elements.append({"label": label, "value": float(value), "group": group})
        chart["elements"] = elements
        return chart
    box = _box_chart(ax)
    if box:
        return box
    lines = [l for l in ax.get_lines() if len(l.get_xdata()) > 0]
    scatters = [c for c in ax.collections if isinstance(c, PathCollection) and len(c.get_offsets())]
    if not lines and not scatters:
        return {"type": "unknown", "title": title, "elements": []}
    chart = _base2d(ax, "line" if lines else "scatter")
    xt, xtl, xs, xkind = _ticks(ax, "x")
    yt, ytl, ys, ykind = _ticks(ax, "y")
    chart.update({"x_ticks": xt, "x_tick_labels": xtl, "x_scale": xs,
                  "y_ticks": yt, "y_tick_labels": ytl, "y_scale": ys})
    elements = []
    if lines:
        for l in lines:
            xd, yd = l.get_xdata(orig=True), l.get_ydata(orig=True)
            pts = [[_value(x, xkind, ax.xaxis), _value(y, ykind, ax.yaxis)] for x, y in zip(xd, yd)]
            elements.append({"label": _label(l), "points": pts})
    else:
        for c in scatters:
            pts = [[_value(x, xkind, ax.xaxis), _value(y, ykind, ax.yaxis)] for x, y in c.get_offsets()]
            elements.append({"label": _label(c), "points": pts})
    chart["elements"] = elements
    return chart


def figure_chart(fig):
    try:
        axes = [ax for ax in fig.get_axes() if ax.get_visible()]
        charts = [axes_chart(ax) for ax in axes]
        sup = getattr(fig, "_suptitle", None)
        sup = sup.get_text() if sup is not None else None
        if len(charts) == 1:
            return jsonable(charts[0])
        return jsonable({"type": "superchart" if charts else "unknown",
                         "title": sup or None, "elements": charts})
    except Exception:
        return None


def _install_pil(display):
    try:
        from PIL import Image, ImageShow
    except Exception:
        return

    class _NotebookViewer(ImageShow.Viewer):
        def show(self, image, **options):
            display(image)
            return 1

    ImageShow.register(_NotebookViewer(), order=-1)
    original_save = Image.Image.save
    if getattr(original_save, "_codeinterp", False):
        return

    def save(self, fp, format=None, **params):
        result = original_save(self, fp, format, **params)
        if isinstance(fp, (str, os.PathLike)):
            try:
                display(self)
            except Exception:
                pass
        return result

    save._codeinterp = True
    save.__wrapped__ = original_save
    save.__doc__ = original_save.__doc__
    Image.Image.save = save


def reseed():
    """Reseeds the global generators of random and numpy from os.urandom.

    Contexts are started before a VM snapshot is taken, so every VM restored
    or forked from it would otherwise continue the same pseudo-random
    sequence.  The server calls this before the first execution and whenever
    /etc/machine-id changed since the last one.  Generators that user code
    created itself (random.Random(), numpy.random.default_rng()) are not
    reached.
    """
    import random
    random.seed()
    np = sys.modules.get("numpy")
    if np is not None:
        try:
            np.random.seed()
        except Exception:
            pass


def enter(cwd):
    """Moves a kernel started elsewhere (a spare, started in the server's
    default cwd) into cwd as if it had been started there: the directory,
    sys.path[0] (python -m puts the start directory first, ahead of the
    standard library) and IPython's directory history."""
    import os
    old = os.getcwd()
    os.chdir(cwd)
    if sys.path and sys.path[0] == old:
        sys.path[0] = cwd
    try:
        get_ipython().user_ns["_dh"][:] = [cwd]  # noqa: F821 - IPython's builtin
    except Exception:
        pass


def preload(names):
    import importlib
    for name in names:
        try:
            importlib.import_module(name)
        except Exception:
            pass


def install(ip):
    from IPython.core.formatters import BaseFormatter
    from IPython.display import display
    from traitlets import ObjectName, Unicode

    # Formatters for extra MIME types.  Types are matched lazily through
    # sys.modules (no import cost) and in __call__, because the inline
    # matplotlib backend drops all registered Figure printers when it starts.
    def register(mime, module, name, func):
        formatters = ip.display_formatter.formatters
        fmt = formatters.get(mime)
        if fmt is None:
            def __call__(self, obj):
                for mod_name, type_name, fn in self.lazy_types:
                    mod = sys.modules.get(mod_name)
                    typ = getattr(mod, type_name, None) if mod is not None else None
                    if typ is not None and isinstance(obj, typ):
                        value = fn(obj)
                        return value if isinstance(value, dict) else None
                return None

            cls = type("CodeinterpFormatter", (BaseFormatter,), {
                "format_type": Unicode(mime),
                "print_method": ObjectName("_repr_codeinterp_none_"),
                "_return_type": (dict,),
                "__call__": __call__,
            })
            fmt = cls(parent=ip.display_formatter)
            fmt.lazy_types = []
            formatters[mime] = fmt
        fmt.lazy_types.append((module, name, func))

    register("e2b/data", "pandas", "DataFrame", dataframe_data)
    register("e2b/chart", "matplotlib.figure", "Figure", figure_chart)
    _install_pil(display)
