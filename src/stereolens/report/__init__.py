"""The HTML report: summary first (the run, the tiny-model warning when it applies, one
bias profile per model across the benchmarks), a table of contents, one section per
benchmark (figures first; long tables collapsed, sortable, downloadable as CSV), image and
response galleries beside it, and the run's models, throughput and settings.

Modules: ``html`` (page building blocks and the jinja2 environment; also used by the
annotation form), ``figures`` (matplotlib helpers), ``galleries`` (thumbnails and gallery
pages), ``summary`` (the first screen), ``inputs`` (the files a report reads),
``contextbias`` / ``biasig`` / ``lvlm`` (one module per benchmark: ``facts``, ``profile``,
``sections``, ``galleries``), ``run`` (models, throughput, settings) and ``render`` (puts
it together). ``html``, ``figures`` and ``galleries`` import no benchmark package.
"""

from __future__ import annotations


def render_report(*args, **kwargs):
    """stereolens.report.render.render_report (imported when called: the plotting stack
    loads only for a report)."""
    from stereolens.report.render import render_report as render

    return render(*args, **kwargs)
