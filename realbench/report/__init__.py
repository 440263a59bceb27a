"""Figures of scenarios, plans, estimates and searches (bokeh), shared by the HTML report
(`realbench.export`) and the widgets."""
