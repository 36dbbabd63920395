-- The webhook outbox, fair and bounded (issue 23): pending deliveries are counted per token
-- (a bound at enqueue), due ones are taken a token at a time, and ended ones are pruned.
CREATE INDEX webhook_deliveries_pending_by_token ON webhook_deliveries (token_id)
    WHERE delivered_at IS NULL AND gave_up_at IS NULL;
CREATE INDEX webhook_deliveries_ended ON webhook_deliveries (coalesce(delivered_at, gave_up_at))
    WHERE delivered_at IS NOT NULL OR gave_up_at IS NOT NULL;
