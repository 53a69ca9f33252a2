"""Looking inside a model and scoring it: one forward pass that keeps what every layer computed
(capture.py), pages to touch built from it (views.py), and multiple-choice scoring by
log-likelihood, HellaSwag's yardstick (multiple_choice.py). Uses the model and the training
core's loss."""
