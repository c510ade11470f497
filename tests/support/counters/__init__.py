"""The framework's test-only service: counters with power-of-two amounts.

Every message of a test carries a distinct power of two, so a counter's total says exactly
which messages it applied, and a message applied twice shows in the sum. Its endpoints use
every part of the protocol the sample does, without the sample:

- `front` (gateway, outbox): outside producers' `Add` and `Spend` commands, relayed to
  `counter` (its inbox table takes batch producers' rows);
- `counter` (consumer, token): `Add` adds to the counter and writes a receipt blob; `Spend`
  writes a receipt blob and asks the `bank` callee over HTTP to debit the amount, and the
  follow-up `Spent` records the bank's answer and reports it to `audit`;
- `audit` (consumer, token; `state` allowed): records every `Reported` it receives;
- `bank` (callee): debits `Withdraw(account, amount)` from a balance, refuses (409) beyond it
  or for an account it does not hold, rejects a negative amount (tests open accounts with
  `seed_state`).

`registry.REGISTRY` declares them (`EO_SERVICE=tests.support.counters.registry:REGISTRY`
runs them in processes).
"""
