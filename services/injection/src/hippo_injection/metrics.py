"""Domain metrics of the injection service (`hippo_injection_*`)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

_SECONDS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)

QUEUE_DEPTH = Gauge(
    "hippo_injection_queue_depth",
    "Requests waiting for the model (the one running excluded), by priority class "
    "(interactive, background: the summariser's merges).",
    ["priority"],
)
REJECTED = Counter(
    "hippo_injection_rejected",
    "Requests refused with RESOURCE_EXHAUSTED because their class's wait list was full, "
    "by priority class.",
    ["priority"],
)
TIME_TO_FIRST_TOKEN = Histogram(
    "hippo_injection_time_to_first_token_seconds",
    "From a Generate request passing validation to its first token, queueing included.",
    buckets=_SECONDS,
)
FORWARD_SECONDS = Histogram(
    "hippo_injection_forward_seconds",
    "Time of one forward pass: prefill (the prompt) or decode (one new token).",
    ["phase"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
GENERATED_TOKENS = Counter(
    "hippo_injection_generated_tokens",
    "Tokens generated, by how the reply finished (length, eos_token, stop_sequence).",
    ["finish_reason"],
)
TOKENS_PER_SECOND = Histogram(
    "hippo_injection_tokens_per_second",
    "Generation rate of each finished reply (tokens / time since its first pass began).",
    buckets=(1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 128),
)
INFLUENCE_STRENGTH = Histogram(
    "hippo_injection_influence_strength",
    "|strength| of each influence applied (with a vector scaled to the layer norm, 1.0 "
    "adds as much as a typical hidden state).",
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32),
)
MODEL_BUSY_SECONDS = Counter(
    "hippo_injection_model_busy_seconds",
    "Seconds the model thread spent on calls (rate() of it is the model's utilisation).",
)

# Known label values start at zero: a series born at its first event is first scraped
# at 1, so rate() never shows that event and a ratio of two such series has gaps.
for _label in ("prefill", "decode"):
    FORWARD_SECONDS.labels(_label)
for _label in ("length", "eos_token", "stop_sequence"):
    GENERATED_TOKENS.labels(_label)
for _label in ("interactive", "background"):  # domain.queue.Priority's values
    QUEUE_DEPTH.labels(_label)
    REJECTED.labels(_label)
