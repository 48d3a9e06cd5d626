"""Regression tests reproducing what broke the peers' loss scaling for real users."""
