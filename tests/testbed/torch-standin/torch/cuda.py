"""torch.cuda, as far as the fabric test asks: one device that is always there."""


def is_available():
    return True


def set_device(_i):
    pass


def synchronize():
    pass


def get_device_name(_i=0):
    return "sparkform stand-in GPU"
