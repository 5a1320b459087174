import sys; sys.setswitchinterval(5e-5)
