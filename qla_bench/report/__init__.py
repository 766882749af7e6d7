"""Human outputs generated from result rows: FlashQLA-style text table, Markdown report, plots.

Modules read rows only (never backends), so reports rebuild on any machine from committed results:
grid (table model), text_table, anchors (FlashQLA's published tables), compare, markdown, plots,
writer (all of them at once). Import the submodule you need; plots pulls in matplotlib.
"""
