"""Human review: the decisions most worth a person's label, and the ways a label comes back.

- :mod:`~training.review.queue`: the review queue (``flywheel review``): which logged decisions
  to ask a person about, and why
- :mod:`~training.review.label_studio`: Label Studio tasks out, its annotations back in
- :mod:`~training.review.feedback`: human labels from Python (:func:`record_feedback`), over
  the site's one writer (:class:`fleet.human_labels.HumanLabels`)
- :mod:`~training.review.app`: ``flywheel ui``, the local page and its JSON API
- :mod:`~training.review.page`: the page itself (HTML, CSS and script)
- :mod:`~training.review.dashboard`: the dashboard's data and chart

Nothing is imported here.
"""
