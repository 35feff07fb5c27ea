# The real CIFAR-10, prepared on the login node before submitting (compute nodes are
# often offline), in the folder with course_helpers.py:
#   DDP_WORKSHOP_DATASET=cifar10 python -c 'import course_helpers as c; c.prepare_cifar10()'
# Missing, it is an error here, never the generated stand-in.
export DDP_WORKSHOP_DATASET=cifar10
