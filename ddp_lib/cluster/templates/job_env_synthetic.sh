# The generated stand-in for CIFAR-10, made by the job itself.
export DDP_WORKSHOP_DATASET=synthetic
