"""The confirmation's statistics: ``confirm`` (which contender to visit, and the verdict at an
error controlled over the looks), ``margin`` (the margin from the measured between-visit noise)
and ``economy`` (how many repetitions a visit runs). No Ray here: visits are handed in."""
