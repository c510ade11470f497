"""The named mutations of the protocol: each removes one guard of docs/protocol.md, and names
the invariants (I1-I10) and failure-table rows (protocol 3.4) whose tests must catch it.

Rows of the failure table, as `rows` names them: `token-load` (token load, TR load, token
check), `register`, `create`, `commit-rejected`, `commit-unknown`, `before-publish` (commit,
before publish), `dispatch` (some or all dispatches), `token-delete` (token delete, before TR
clear), `tr-clear` (TR clear, before ack).

`killers` are the fast-suite tests run for the mutation (in this order, stopping at the first
failure): the ones known to kill it, so the suite fits the CI budget; `python -m
tests.mutation.run --discover NAME` runs the whole fast suite on a mutation and lists every
test that fails.
"""

# ruff: noqa: E501 - `before` texts are the code's own lines, as long as they are there

from __future__ import annotations

from dataclasses import dataclass

INVARIANTS = tuple(f"I{i}" for i in range(1, 11))
ROWS = ("token-load", "register", "create", "commit-rejected", "commit-unknown",
        "before-publish", "dispatch", "token-delete", "tr-clear")

_INTERLEAVINGS = "tests/unit/application/test_interleavings.py"
_FAILURE_TABLE = "tests/unit/application/test_failure_table.py"
_BATCH = "tests/unit/application/test_token_batch.py"
_BATCH_INTERLEAVINGS = "tests/unit/application/test_batch_interleavings.py"
_CLAIM_CHECK = "tests/unit/application/test_colocated_claim_check.py"
_API = "tests/unit/application/test_third_party_api.py"
_FENCE_CAMPAIGN = "tests/template/test_fence_on_the_fixture.py"
_SAMPLE_CAMPAIGN = "tests/sample/chaos/test_campaign.py"
#: Where each half of finish's fence is written (the fence campaigns' mutations remove it).
_ATTEMPT_GUARD = ("application/finisher.py",
                  """            if (tr.message_id, tr.attempt_id) != (message_id, attempt_id):
                return False""", """            if False:
                return False""")
_COMPARE_AND_CLEAR = ("adapters/postgres/sql/writes.py",
                      """   WHERE endpoint = $1 AND partition_key = $2 AND version = $3
  RETURNING 1)\"\"\"""", """   WHERE endpoint = $1 AND partition_key = $2 AND $3::bigint IS NOT NULL
  RETURNING 1)\"\"\"""")


@dataclass(frozen=True)
class Mutation:
    """One guard removed: `file`'s `before` text (exactly once there) becomes `after`; a
    guard written in two places has its second in `also` ((file, before, after) each)."""

    name: str
    guard: str
    file: str
    before: str
    after: str
    killers: tuple[str, ...]
    invariants: tuple[str, ...] = ()
    rows: tuple[str, ...] = ()
    also: tuple[tuple[str, str, str], ...] = ()

    @property
    def edits(self) -> tuple[tuple[str, str, str], ...]:
        """Every (file, before, after) of the mutation."""
        return ((self.file, self.before, self.after), *self.also)


MUTATIONS: tuple[Mutation, ...] = (
    Mutation(
        name="token-not-rechecked-after-tr-load",
        guard="3.1: check the token AFTER loading the TR",
        file="application/token_path.py",
        before="""        if not exists:
            raise Duplicate""",
        after="""        if False:
            raise Duplicate""",
        killers=(f"{_INTERLEAVINGS}::test_every_schedule_within_two_preemptions_keeps_the_"
                 "invariants",),
        invariants=("I1",), rows=("token-load",)),
    Mutation(
        name="no-token-check-at-all",
        guard="3.1: no token means duplicate (at load and after the TR load)",
        file="application/token_path.py",
        before="""        if stored is None:
            raise Duplicate
        return stored""",
        after="""        if stored is None:
            return envelope
        return stored""",
        also=(("application/token_path.py", """        if not exists:
            raise Duplicate""", """        if False:
            raise Duplicate"""),),
        killers=(f"{_FAILURE_TABLE}::test_crash_after_clear_leaves_nothing_and_redelivery_is_"
                 "dropped",),
        invariants=("I1",), rows=("tr-clear",)),
    Mutation(
        name="finish-without-the-attempt-guard",
        guard="3.1: finish acts only while the TR is committed to (M, A) (one half of the "
              "fence; the compare-and-clear stays)",
        file="application/finisher.py",
        before="""            if (tr.message_id, tr.attempt_id) != (message_id, attempt_id):
                return False""",
        after="""            if False:
                return False""",
        killers=(f"{_INTERLEAVINGS}::test_three_workers_find_a_finish_without_its_attempt_"
                 "guard",),
        invariants=("I5", "I6", "I8")),
    Mutation(
        name="clear-without-compare",
        guard="3.1: compare-and-clear (the other half of the fence)",
        file="adapters/memory/transactional_store.py",
        before="""        if p.tr.version != expected_version:
            return False
        if consume is not None:""",
        after="""        if consume is not None:""",
        killers=(f"{_INTERLEAVINGS}::test_three_workers_find_a_clear_without_its_compare",),
        invariants=("I5",)),
    Mutation(
        name="postgres-finish-publishes-an-unreplicated-commit",
        guard="3.1: finish publishes a committed attempt it read only once that commit is "
              "durable (PostgreSQL: the barrier commit after the read waits for the "
              "synchronous standby)",
        file="adapters/postgres/transactional_store.py",
        before="""            if row is not None and row["message_id"] is not None:""",
        after="""            if False:""",
        killers=("tests/integration/test_postgres_failover.py::test_a_finishers_read_of_a_"
                 "commit_not_yet_replicated_waits_for_it",),
        invariants=("I3", "I7")),
    Mutation(
        name="postgres-clear-without-compare",
        guard="3.1: compare-and-clear (the fence's other half) in PostgreSQL's clear statements",
        file="adapters/postgres/sql/writes.py",
        before="""   WHERE endpoint = $1 AND partition_key = $2 AND version = $3
  RETURNING 1)\"\"\"""",
        after="""   WHERE endpoint = $1 AND partition_key = $2 AND $3::bigint IS NOT NULL
  RETURNING 1)\"\"\"""",
        killers=("tests/integration/test_postgres_protocol.py::test_a_clear_on_a_stale_version_"
                 "leaves_the_next_commit_alone",),
        invariants=("I1", "I5")),
    Mutation(
        name="winner-leaves-the-losers-artifacts",
        guard="3.1: finish cleans up the aborted attempts' artifacts",
        file="application/finisher.py",
        before="""            await self.effects.clean_up(rec.kind, rec.key, rec.payload)
            self._events.emit(SIDE_EFFECT_CLEANED""",
        after="""            pass
            self._events.emit(SIDE_EFFECT_CLEANED""",
        killers=(f"{_INTERLEAVINGS}::test_every_schedule_within_two_preemptions_keeps_the_"
                 "invariants",
                 f"{_FAILURE_TABLE}::test_crash_after_create_leaves_an_artifact_the_winner_"
                 "deletes"),
        invariants=("I8",), rows=("create",)),
    Mutation(
        name="no-recheck-after-create",
        guard="3.2 step 3: re-check the registration after creating the artifact",
        file="application/preparation.py",
        before="""        if not await store.registration_valid(rec):""",
        after="""        if False:""",
        killers=(f"{_FAILURE_TABLE}::test_an_artifact_created_after_the_winners_clean_up_is_"
                 "deleted_by_its_own_recheck",),
        invariants=("I8",), rows=("create",)),
    Mutation(
        name="aborted-records-not-deferred",
        guard="8.2: clear lists the aborted records for deferred clean-up",
        file="adapters/memory/transactional_store.py",
        before="""        self._bump(p, message_id=None, attempt_id=None, committed_at=None)
        self._defer(aborted, cleanup_due)""",
        after="""        self._bump(p, message_id=None, attempt_id=None, committed_at=None)""",
        killers=(f"{_FAILURE_TABLE}::test_artifact_created_after_the_winners_clean_up_goes_"
                 "by_deferred_clean_up",),
        invariants=("I8",), rows=("create",)),
    Mutation(
        name="clear-keeps-the-records",
        guard="3.1: clear deletes exactly the transaction's records",
        file="adapters/memory/transactional_store.py",
        before="""        p.records = [r for r in p.records if not any(_same(r, x) for x in records)]
        p.in_tokens = ()""",
        after="""        p.in_tokens = ()""",
        killers=(f"{_FAILURE_TABLE}::test_crash_after_register_leaves_a_record_the_winner_"
                 "cleans",),
        invariants=("I8",), rows=("register",)),
    Mutation(
        name="rejection-not-rechecked",
        guard="handler runner: a rejection judged on a state replaced meanwhile is a "
              "conflict (design notes)",
        file="application/handler_runner.py",
        before="""            if await changed():
                raise Conflict""",
        after="""            if False:
                raise Conflict""",
        killers=("tests/unit/application/test_rejection_race.py",),
        invariants=("I1", "I10")),
    Mutation(
        name="state-path-rejection-not-rechecked",
        guard="state path: a rejection judged on a stream appended meanwhile is a conflict",
        file="application/state_path.py",
        before="""                    return mine is not None or now_version != version""",
        after="""                    return False""",
        killers=("tests/unit/application/test_rejection_race.py::test_the_state_path_"
                 "rechecks_a_rejection_against_its_stream",),
        invariants=("I1", "I10")),
    Mutation(
        name="conflict-not-retried",
        guard="7: an optimistic-concurrency conflict is retried (a lost commit is no "
              "verdict)",
        file="application/processor.py",
        before="""            except Conflict as exc:
                ev.emit(TRANSACTION_CONFLICT, endpoint=name, message_id=m, reason=str(exc))""",
        after="""            except Conflict as exc:
                raise PermanentError(str(exc)) from exc""",
        killers=(f"{_FAILURE_TABLE}::test_a_commit_rejected_by_a_conflict_is_retried_and_the_"
                 "winner_cleans_up",),
        invariants=("I10",), rows=("commit-rejected",)),
    Mutation(
        name="own-committed-transaction-not-finished",
        guard="3.1: a redelivery that finds the TR committed to its message finishes it",
        file="application/transactional_path.py",
        before="""            await self.finisher.finish(partition, tr.message_id, tr.attempt_id)
            if tr.message_id == m:""",
        after="""            if tr.message_id != m:
                await self.finisher.finish(partition, tr.message_id, tr.attempt_id)
            if tr.message_id == m:""",
        killers=(f"{_FAILURE_TABLE}::test_commit_with_unknown_outcome_is_finished_without_"
                 "running_the_handler_again",
                 f"{_FAILURE_TABLE}::test_crash_after_commit_is_finished_by_redelivery_without_"
                 "a_second_handler_run"),
        invariants=("I5",), rows=("commit-unknown", "before-publish")),
    Mutation(
        name="next-message-does-not-finish-the-partition",
        guard="3.1: the next message of a partition finishes its committed transaction first",
        file="application/transactional_path.py",
        before="""        while (tr := loaded.tr).message_id is not None and tr.attempt_id is not None:""",
        after="""        while (tr := loaded.tr).message_id == m and tr.attempt_id is not None:""",
        killers=(f"{_FAILURE_TABLE}::test_crash_after_token_delete_is_finished_by_the_next_"
                 "message_of_the_partition",),
        invariants=("I5", "I10"), rows=("token-delete",)),
    Mutation(
        name="sweeper-leaves-stale-transactions",
        guard="8.1: the sweeper finishes transactions committed longer than a threshold",
        file="application/sweeper.py",
        before="""                finished += await self.finisher.finish(tr.partition, tr.message_id, tr.attempt_id)""",
        after="""                pass""",
        killers=(f"{_FAILURE_TABLE}::test_crash_after_token_delete_is_finished_by_the_"
                 "sweeper",),
        invariants=("I5", "I10"), rows=("token-delete",)),
    Mutation(
        name="token-created-at-dispatch",
        guard="3.3: a token is created before the commit, never at dispatch time",
        file="application/side_effects.py",
        before="""            destination, envelope = from_message_payload(key, payload)
            await self.dispatcher.dispatch(destination, envelope)""",
        after="""            destination, envelope = from_message_payload(key, payload)
            await self.tokens.create(destination, [envelope])
            await self.dispatcher.dispatch(destination, envelope)""",
        killers=(f"{_FAILURE_TABLE}::test_a_repeated_publication_never_recreates_an_"
                 "outgoing_token_already_consumed",),
        invariants=("I1",), rows=("dispatch",)),
    Mutation(
        name="outgoing-id-per-dispatch",
        guard="3.3: the winner's outgoing message IDs are final at commit (re-dispatch "
              "sends the same ID)",
        file="application/side_effects.py",
        before="""        message_id=uuid.UUID(key),""",
        after="""        message_id=uuid.uuid4(),""",
        killers=(f"{_FAILURE_TABLE}::test_crash_after_commit_is_finished_by_redelivery_without_"
                 "a_second_handler_run",),
        invariants=("I2",), rows=("dispatch",)),
    Mutation(
        name="finish-publishes-every-attempt",
        guard="3.1: finish publishes the committed attempt's records only",
        file="application/finisher.py",
        before="""    winners = sorted((r for r in records if r.attempt_id == attempt_id), key=_order)""",
        after="""    winners = sorted(records, key=_order)""",
        killers=(f"{_INTERLEAVINGS}::test_every_schedule_within_two_preemptions_keeps_the_"
                 "invariants",),
        invariants=("I3", "I4", "I7")),
    Mutation(
        name="token-consumed-before-publication",
        guard="3.1: the incoming token is deleted after every side effect is published",
        file="application/finisher.py",
        before="""        fp, ev = self._fp, self._events
        if not batched:""",
        after="""        fp, ev = self._fp, self._events
        tokens = getattr(self._consumption, "tokens", None)
        if tokens is not None:
            await tokens.delete(plans[0].message_id)
        if not batched:""",
        killers=(f"{_FAILURE_TABLE}::test_crash_after_commit_is_finished_by_redelivery_without_"
                 "a_second_handler_run",),
        invariants=("I6",)),
    Mutation(
        name="token-never-consumed",
        guard="3.1: finish consumes the incoming token (deduplication state bounded by the "
              "messages in flight)",
        file="application/consumption.py",
        before="""            await self.tokens.delete(m)  # consume: the last publication step""",
        after="""            pass""",
        killers=(f"{_FAILURE_TABLE}::test_crash_before_anything_durable_leaves_nothing",),
        invariants=("I9",)),
    Mutation(
        name="outbox-without-positive-proof",
        guard="4: a processed-message row drops the copies of a processed message",
        file="application/outbox_path.py",
        before="""        row = await self.processed.processed(stored.message_id, stored.producer)
        if row is not None:""",
        after="""        row = await self.processed.processed(stored.message_id, stored.producer)
        if False:""",
        killers=("tests/unit/application/test_outbox.py::test_duplicate_republishes_the_"
                 "stored_copy_without_running_the_handler",),
        invariants=("I1", "I10")),
    Mutation(
        name="outbox-accepts-another-body-under-a-known-id",
        guard="4 (amendment): a known message ID with another body is no copy",
        file="application/outbox_path.py",
        before="""            if not stored.same_message(row.digest, row.body_sha256):""",
        after="""            if False:""",
        killers=("tests/unit/application/test_boundary_security.py",),
        invariants=("I1",)),
    Mutation(
        name="digest-ignores-the-type",
        guard="4 (amendment): the digest that tells a copy from another message under a "
              "known ID covers the type and the body",
        file="application/envelope.py",
        before="""        return hashlib.sha256(b"%d:%s" % (len(kind), kind) + self.body).hexdigest()""",
        after="""        return hashlib.sha256(self.body).hexdigest()""",
        killers=("tests/unit/application/test_boundary_security.py::test_a_known_message_id_"
                 "with_the_same_bytes_but_another_type_is_no_copy",),
        invariants=("I1",)),
    Mutation(
        name="gateway-claim-ignores-the-producer",
        guard="4 (amendment): a gateway's claim is (producer, message ID): one producer "
              "cannot squat another's IDs",
        file="application/outbox_path.py",
        before="""        row = await self.processed.processed(stored.message_id, stored.producer)""",
        after="""        row = await self.processed.processed(stored.message_id)""",
        also=(("application/outbox_path.py",
               """                                self.clock.now(), stored.body_sha256, stored.digest,
                                stored.producer)""",
               """                                self.clock.now(), stored.body_sha256, stored.digest)"""),),
        killers=("tests/unit/application/test_boundary_security.py::test_a_producer_cannot_"
                 "squat_another_producers_message_ids",),
        invariants=("I1",)),
    Mutation(
        name="processed-claim-does-nothing-on-conflict",
        guard="4: the processed-message row claims the message ID; the commit that loses "
              "the claim (a concurrent commit of the ID on another partition) rolls back whole",
        file="adapters/postgres/sql/writes.py",
        before="""  SELECT $1, $5, $2, to_jsonb($18::jsonb[]), $7, $24, $27, $28 FROM tr WHERE $8),""",
        after="""  SELECT $1, $5, $2, to_jsonb($18::jsonb[]), $7, $24, $27, $28 FROM tr WHERE $8
  ON CONFLICT (endpoint, producer, message_id) DO NOTHING),""",
        killers=("tests/integration/test_postgres_protocol.py::test_one_message_id_with_two_"
                 "bodies_on_two_partitions_commits_once",),
        invariants=("I1",)),
    Mutation(
        name="state-entry-claims-per-partition-only",
        guard="state strategy: an entry claims its message ID for the endpoint, not only for "
              "its partition (another body under the ID on another partition is refused)",
        file="adapters/postgres/migrations/versions/0009_state_entry_claims_the_id.py",
        before='op.execute("CREATE UNIQUE INDEX eo_state_entry_message ON eo_state_entry "',
        after='op.execute("CREATE INDEX eo_state_entry_message ON eo_state_entry "',
        killers=("tests/contract/test_state_stream_contract.py",),
        invariants=("I1",)),
    Mutation(
        name="discard-of-a-committed-message",
        guard="7 (amendment): a discard is refused while the message's transaction is "
              "committed (its finish consumes the token)",
        file="application/dead_letters.py",
        before="""            if tr.message_id == m:""",
        after="""            if False:""",
        killers=("tests/unit/application/test_dead_letter_operations.py::test_a_discard_of_a_"
                 "processed_message_whose_finish_is_pending_is_refused",),
        invariants=("I5",)),
    Mutation(
        name="dead-letter-held-by-two-operators",
        guard="7 (amendment): an action holds its dead letter (one of two operators acts)",
        file="adapters/postgres/dead_letter_store.py",
        before=""""FOR UPDATE SKIP LOCKED", dead_letter_id)""",
        after=""""", dead_letter_id)""",
        killers=("tests/contract/test_dead_letter_store_contract.py",),
        invariants=("I1",)),
    Mutation(
        name="full-dead-letter-queue-does-not-pause",
        guard="7 (amendment): while a dead letter waits for room the source takes no new "
              "delivery",
        file="adapters/rabbitmq/dead_letter_queue.py",
        before="""        while self.blocked and not stopped():""",
        after="""        while False:""",
        killers=("tests/integration/test_rabbitmq.py::test_a_full_dead_letter_queue_holds_the_"
                 "dead_letter_and_pauses_the_source",),
        invariants=("I10",)),
    Mutation(
        name="producer-taken-from-any-header",
        guard="4 (amendment): `eo-producer` is trusted only on the service's own copies",
        file="adapters/rabbitmq/dispatcher.py",
        before="""    if service_user is not None and user_id == service_user:""",
        after="""    if True:""",
        killers=("tests/integration/test_rabbitmq.py::test_the_producer_is_the_validated_user_"
                 "id_and_survives_the_services_copies",),
        invariants=("I1",)),
    Mutation(
        name="inbox-relay-blocked-by-an-unrelayable-row",
        guard="4 (boundary inbox): a row that cannot be relayed is dead-lettered, never "
              "left at the head of the inbox",
        file="application/inbox_relay.py",
        before="""        reason = unrelayable(envelope, self.max_body_bytes)""",
        after="""        reason = None""",
        killers=("tests/unit/application/test_inbox_relay.py::test_rows_that_cannot_be_relayed_"
                 "are_dead_lettered_and_the_rest_go_on",),
        invariants=("I10",)),
    Mutation(
        name="token-rows-rewritable",
        guard="3 (claim check): nobody rewrites an in-flight message's token row",
        file="adapters/postgres/migrations/versions/0012_least_privilege.py",
        before="""          WHEN (NEW.message_id IS DISTINCT FROM OLD.message_id""",
        after="""          WHEN (false AND NEW.message_id IS DISTINCT FROM OLD.message_id""",
        killers=("tests/integration/test_least_privilege.py::test_nobody_rewrites_a_token_and_"
                 "the_service_inserts_no_inbox_row",),
        invariants=("I2",)),
    Mutation(
        name="inbox-rows-of-anyone",
        guard="4 (boundary inbox): a row is inserted only by a producer, in its own name, "
              "for a gateway it is granted",
        file="adapters/postgres/migrations/versions/0012_least_privilege.py",
        before="""          producer = current_user AND EXISTS (""",
        after="""          true OR EXISTS (""",
        killers=("tests/integration/test_least_privilege.py::test_nobody_rewrites_a_token_and_"
                 "the_service_inserts_no_inbox_row",),
        invariants=("I1",)),
    Mutation(
        name="state-grows-without-bound",
        guard="boundary: a partition's state is bounded (EO_MAX_STATE_BYTES); the message "
              "that would pass the bound is dead-lettered, not committed",
        file="application/handler_runner.py",
        before="""            if size > limit:""",
        after="""            if False:""",
        killers=("tests/unit/application/test_boundary_security.py::test_a_state_over_the_"
                 "limit_is_not_committed_and_the_message_dead_lettered",),
        invariants=("I10",)),
    Mutation(
        name="transient-failure-acked",
        guard="7: a transient failure is retried, then dead-lettered with a reason, never "
              "dropped",
        file="application/settlement.py",
        before="""                await delivery.retry(delay, reason)
            except TransientError as exc:  # the broker redelivers it: a retry all the same""",
        after="""                await delivery.ack()
            except TransientError as exc:  # the broker redelivers it: a retry all the same""",
        killers=("tests/unit/application/test_consumer.py",),
        invariants=("I10",)),
    Mutation(
        name="follow-up-request-never-deleted",
        guard="6 step 3: the follow-up's commit records the DELETE of its request",
        file="application/preparation.py",
        before="""        if request_url is not None:  # the follow-up's commit deletes it (protocol 6, step 3)""",
        after="""        if False:""",
        killers=("tests/unit/application/test_http_protocol.py::test_follow_up_debits_the_"
                 "account_and_deletes_the_request_on_the_callee",),
        invariants=("I8",)),
    Mutation(
        name="records-in-tokens-not-read-back",
        guard="3.1 (co-located): finish reads back the message records that the outgoing "
              "tokens stand for (SideEffectRecord.in_token)",
        file="adapters/memory/transactional_store.py",
        before="""        return p.tr, tuple(p.records) + self._read_back(p)""",
        after="""        return p.tr, tuple(p.records)""",
        killers=(f"{_FAILURE_TABLE}::test_crash_after_commit_is_finished_by_redelivery_without_"
                 "a_second_handler_run",),
        invariants=("I5",), rows=("before-publish",)),
    Mutation(
        name="batch-claim-check-trusts-the-delivery",
        guard="3.1 (batched): the token's message is processed, not the delivery's body "
              "(claim check; docs/security.md)",
        file="application/claim_check.py",
        before="""    return stored.type == delivery.type and stored.body == delivery.body""",
        after="""    return True""",
        killers=(f"{_BATCH}::test_a_delivery_that_is_not_its_tokens_message_goes_singly_as_"
                 "the_token_says",),
        invariants=("I3",)),
    Mutation(
        name="batch-no-token-check-at-all",
        guard="3.1 (batched): no token, read with the TR, means duplicate",
        file="application/token_batch.py",
        before="""            stored, delivery = load.token, item.delivery
            if stored is None:""",
        after="""            stored, delivery = load.token or item.delivery, item.delivery
            if stored is None:""",
        killers=(f"{_BATCH}::test_a_crash_before_the_acks_leaves_duplicates_only",
                 f"{_BATCH}::test_a_message_finished_elsewhere_before_the_batch_read_is_a_"
                 "duplicate",
                 f"{_BATCH_INTERLEAVINGS}::test_two_batches_sharing_a_partition_keep_the_"
                 "invariants"),
        invariants=("I1",), rows=("token-load", "tr-clear")),
    Mutation(
        name="batch-consumes-before-publication",
        guard="3.1 (batched): every output of the batch is published and confirmed before "
              "its tokens are consumed",
        file="application/finisher.py",
        before="""            outcomes = await asyncio.gather(*(self._publish(p.winners, p.fields) for p in plans),""",
        after="""            await self._store.clear_many([Clear(p.clear.partition, p.clear.expected_version,
                                                p.clear.records, [], self._clock.now(),
                                                p.message_id) for p in plans])
            outcomes = await asyncio.gather(*(self._publish(p.winners, p.fields) for p in plans),""",
        killers=(f"{_BATCH}::test_a_batch_costs_one_statement_per_step_for_all_its_messages",),
        invariants=("I6",), rows=("token-delete",)),
    Mutation(
        name="colocated-claim-check-trusts-the-delivery",
        guard="3.1 (co-located): the token's message is processed, not the delivery's body "
              "(claim check; docs/security.md)",
        file="application/claim_check.py",
        before="""    return stored.type == delivery.type and stored.body == delivery.body""",
        after="""    return True""",
        killers=(f"{_CLAIM_CHECK}::test_a_delivery_that_is_not_the_tokens_message_is_"
                 "processed_as_the_token_says",),
        invariants=("I3",)),
    Mutation(
        name="colocated-no-token-check-at-all",
        guard="3.1 (co-located): no token means duplicate (at the read with the TR and at "
              "the re-check)",
        file="application/claim_check.py",
        before="""            stored = loaded.token
            if stored is None:""",
        after="""            stored = loaded.token or envelope
            if stored is None:""",
        also=(("application/token_path.py", """        if not exists:
            raise Duplicate""", """        if False:
            raise Duplicate"""),),
        killers=(f"{_CLAIM_CHECK}::test_a_delivery_without_its_token_is_a_duplicate_and_"
                 "writes_nothing",
                 f"{_FAILURE_TABLE}::test_crash_after_clear_leaves_nothing_and_redelivery_is_"
                 "dropped"),
        invariants=("I1",), rows=("tr-clear",)),
    Mutation(
        name="api-sent-after-its-window",
        guard="12: a third-party request is never sent after its key's window (the provider "
              "may have forgotten the key: a send could execute it twice)",
        file="application/api_caller.py",
        before="""            if self.clock.now() >= deadline:""",
        after="""            if False:""",
        killers=(f"{_API}::test_past_the_keys_window_nothing_is_sent_and_the_follow_up_dead_"
                 "letters",),
        invariants=("I1",)),
    Mutation(
        name="api-key-per-attempt",
        guard="12: the idempotency key is the follow-up's message ID, the same on every "
              "delivery and attempt",
        file="application/api_caller.py",
        before="""        key, content = stored.id_text, request.content()""",
        after="""        key, content = f"{stored.id_text}-{id(self)}", request.content()""",
        killers=(f"{_API}::test_a_crash_after_the_answer_is_redelivered_and_gets_the_stored_"
                 "answer",),
        invariants=("I1",)),
    Mutation(
        name="api-request-sent-before-the-commit",
        guard="12: nothing is sent before the commit: the request travels in the committed "
              "follow-up",
        file="application/preparation.py",
        before="""            follow_up_headers.update(self._api_request(decision.api_call, now))""",
        after="""            follow_up_headers.update(self._api_request(decision.api_call, now))
            assert self._api is not None and self._api.apis is not None
            await self._api.apis.send(decision.api_call.api, decision.api_call.method,
                                      decision.api_call.path, None, str(attempt))""",
        killers=(f"{_API}::test_a_losing_attempt_of_the_original_message_sends_nothing",),
        invariants=("I1",)),
    Mutation(
        name="api-replayed-after-its-window",
        guard="12: a dead-lettered follow-up is not replayed past its key's window",
        file="application/dead_letters.py",
        before="""                if deadline is not None and self.clock.now() >= deadline:""",
        after="""                if False:""",
        killers=("tests/unit/application/test_dead_letter_operations.py::test_a_replay_past_"
                 "its_third_party_idempotency_window_is_refused",),
        invariants=("I1",)),
    Mutation(
        name="api-replay-trusts-the-copys-deadline",
        guard="12: a replay reads the window its sender committed (the token), never the "
              "dead-letter copy's header (a forged copy could claim any)",
        file="application/dead_letters.py",
        before="""                deadline = deadline_in(letter.headers if token is None else token.headers)""",
        after="""                deadline = deadline_in(letter.headers)""",
        killers=("tests/unit/application/test_dead_letter_operations.py::test_a_replay_reads_"
                 "the_window_its_sender_committed_not_the_copys",),
        invariants=("I1",)),
    Mutation(
        name="short-strings-decoded-strictly",
        guard="7 (issue 37): a frame is read whatever bytes its short strings hold (one "
              "0xff must not close the connection and requeue every delivery on it)",
        file="adapters/rabbitmq/wire.py",
        before="""    pamqp_decode.METHODS["shortstr"] = short_str""",
        after="""    pass""",
        killers=("tests/integration/test_hostile_bytes.py::test_bytes_that_are_not_utf8_never_"
                 "take_the_channel_down",),
        invariants=("I10",)),
    Mutation(
        name="unclean-type-admitted",
        guard="7 (issue 37): a type that is not clean text (U+0000, bytes that are not "
              "UTF-8) is dead-lettered at admission",
        file="application/envelope.py",
        before="""    _check_clean("type", type_)""",
        after="""    pass""",
        killers=("tests/unit/application/test_dead_letters.py::test_a_type_message_id_or_kept_"
                 "header_that_is_not_clean_text_is_malformed",),
        invariants=("I10",)),
    Mutation(
        name="dead-letter-text-kept-raw",
        guard="7 (issue 37): a dead letter's texts are kept escaped where a store cannot "
              "hold them (else PostgreSQL refuses the entry on every sweep)",
        file="application/dead_letter_copies.py",
        before="""        if text is None or clean(text):""",
        after="""        if True:""",
        killers=("tests/unit/application/test_dead_letters.py::test_every_text_of_a_dead_letter_"
                 "is_clean_and_its_bytes_are_kept",
                 "tests/integration/test_hostile_bytes.py::test_every_hostile_dead_letter_"
                 "reaches_the_store_with_its_reason"),
        invariants=("I10",)),
    Mutation(
        name="clipped-copies-not-merged",
        guard="7 (issue 37): every copy of one message is one dead-letter entry (a clipped "
              "body's digest is the whole body's)",
        file="application/dead_letter_copies.py",
        before="""        if raw_message_id else None, replayable=replayable,""",
        after="""        if raw_message_id and BODY_SHA256_HEADER not in headers else None,
        replayable=replayable,""",
        killers=("tests/contract/test_dead_letter_store_contract.py",),
        invariants=("I10",)),
    Mutation(
        name="dead-letter-collection-stalls-on-one-entry",
        guard="7 (issue 37): an entry the collector cannot read or store as it came is kept "
              "in its plainest form; the queue behind it is collected",
        file="adapters/rabbitmq/dead_letter_queue.py",
        before="""        except Exception as exc:  # noqa: BLE001 - whatever this one entry does, go on
            error: Exception = exc""",
        after="""        except Exception as exc:  # noqa: BLE001 - whatever this one entry does, go on
            raise""",
        killers=("tests/integration/test_hostile_bytes.py::test_an_entry_the_store_refuses_goes_"
                 "aside_and_the_rest_is_collected",),
        invariants=("I10",)),
    Mutation(
        name="fence-campaign-sees-finish-without-the-attempt-guard",
        guard="eo chaos (tools/chaos/fence.py): the fence scenario of the attempt guard "
              "reports a finish without it, on real processes",
        file=_ATTEMPT_GUARD[0], before=_ATTEMPT_GUARD[1], after=_ATTEMPT_GUARD[2],
        killers=(f"{_FENCE_CAMPAIGN}::test_the_fence_scenarios_find_no_violation_on_the_"
                 "fixture_service",),
        invariants=("I1",)),
    Mutation(
        name="fence-campaign-sees-clear-without-compare",
        guard="eo chaos (tools/chaos/fence.py): the fence scenario of the compare-and-clear "
              "reports PostgreSQL's clear without its compare, on real processes",
        file=_COMPARE_AND_CLEAR[0], before=_COMPARE_AND_CLEAR[1], after=_COMPARE_AND_CLEAR[2],
        killers=(f"{_FENCE_CAMPAIGN}::test_the_fence_scenarios_find_no_violation_on_the_"
                 "fixture_service",),
        invariants=("I1",)),
    Mutation(
        name="fence-campaign-on-the-sample-sees-finish-without-the-attempt-guard",
        guard="eo chaos on the sample (issue 38): its fence scenarios report a finish "
              "without the attempt guard",
        file=_ATTEMPT_GUARD[0], before=_ATTEMPT_GUARD[1], after=_ATTEMPT_GUARD[2],
        killers=(f"{_SAMPLE_CAMPAIGN}::test_a_short_campaign_injects_faults_and_finds_no_"
                 "violation",),
        invariants=("I1",)),
    Mutation(
        name="fence-campaign-on-the-sample-sees-clear-without-compare",
        guard="eo chaos on the sample (issue 38): its fence scenarios report PostgreSQL's "
              "clear without its compare",
        file=_COMPARE_AND_CLEAR[0], before=_COMPARE_AND_CLEAR[1], after=_COMPARE_AND_CLEAR[2],
        killers=(f"{_SAMPLE_CAMPAIGN}::test_a_short_campaign_injects_faults_and_finds_no_"
                 "violation",),
        invariants=("I1",)),
)
