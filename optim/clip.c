/* clip.c — being written */
