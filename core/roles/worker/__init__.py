"""The worker role (:mod:`.role`) and everything only it runs: its two intakes (the stream's,
:mod:`.stream`, and the direct one, :mod:`.direct`), its lanes and their acks (:mod:`.lanes`), the
verdict writer (:mod:`.verdicts`) and the jobs a judge defers (:mod:`.deferral`)."""
