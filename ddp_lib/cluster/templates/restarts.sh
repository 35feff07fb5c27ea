# A restarted group must not read the failed attempt's addresses from torchrun's
# store: give the workers a store of their own.
{{exports}}
