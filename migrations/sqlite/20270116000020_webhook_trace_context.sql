-- One trace from a delivery to each attempt (issue 35, feature `otel`): the accept's span
-- context, W3C `traceparent` and `tracestate` (NULL when empty), stored with the event at
-- its accept, after verification. The attempts read it with their claim: the route's first
-- run since the accept is its child, every other run a new trace linked to it. NULL
-- without the feature, without an OpenTelemetry layer, and for every event from before.
-- Columns added NULL, without a default: no table rewrite.
ALTER TABLE webhook_events ADD COLUMN traceparent TEXT;
ALTER TABLE webhook_events ADD COLUMN tracestate TEXT;
