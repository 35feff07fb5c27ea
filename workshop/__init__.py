"""Running the course as a workshop: the learners' edition and the instructor's schedule.

The lessons never import this package; it reads the notebooks as files. ``ddp_lib`` is the
lessons' plumbing, so these tools for the people who teach them live apart from it.
"""
