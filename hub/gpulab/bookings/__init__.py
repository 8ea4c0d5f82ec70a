"""Bookings: a member (or an admin for her) books N GPUs for a time window.

Pure decisions: :mod:`gpulab.bookings.book` (which GPUs a booking takes, what is refused
and why, what a running booking keeps, which servers it stops). I/O around them:
:mod:`gpulab.bookings.store` (SQLite beside the hub's database), :mod:`gpulab.bookings.api`
(the REST API and the page ``/hub/bookings``), :mod:`gpulab.bookings.view` (her home
page). The spawner and the line count the GPUs of running bookings as taken
(:func:`gpulab.bookings.book.holds`); the GPU culler warns and stops the servers of others
that hold them when a booking starts (:mod:`gpulab.culler.decide`).
"""
