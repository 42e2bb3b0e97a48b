"""ipywidgets panels: thin controls that call pure experiment functions and draw."""
