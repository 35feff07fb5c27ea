"""Sphinx's settings for the course's site (``make book``, ``workshop/book.py``): MyST-NB reads
the lessons as executed notebooks, never executing them itself, and the book theme gives each
lesson its sections in a side bar. The sources are generated in build/book-src/."""

project = "ddp-workshop"
author = "the ddp-workshop authors"
extensions = ["myst_nb"]
exclude_patterns = ["_build", "**.ipynb_checkpoints"]

nb_execution_mode = "off"  # the notebooks come executed: workshop/book.py says from where
nb_merge_streams = True  # a launch's output, one block per cell
myst_heading_anchors = 3  # the docs link to sections by their GitHub anchors (#gpu)
myst_enable_extensions = ["dollarmath"]
suppress_warnings = ["mystnb.unknown_mime_type"]

html_theme = "sphinx_book_theme"
html_title = "ddp-workshop"
html_theme_options = {
    "show_toc_level": 2,  # the lesson's sections beside it
    "use_download_button": True,
    "home_page_in_toc": True,
}
html_static_path: list[str] = []
