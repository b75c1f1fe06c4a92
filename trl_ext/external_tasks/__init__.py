"""Tasks no one here wrote: adapters from public procedural task libraries to TRL datasets and rewards
(:mod:`.reasoning_gym`: ``--dataset_name reasoning_gym:<task>``). Each library is an optional extra."""
