import sys; sys.setswitchinterval(2e-4)
